"""The small regression module and data the logger and plot tests train (F-OBS-2, F-OBS-3): the shared
``SumRegression`` of ``tests/jobs_common.py`` logging ``mae`` in validation."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import SumRegression  # noqa: E402
from jobs_common import sum_data as regression_data  # noqa: E402,F401


class Regression(SumRegression):
    """Linear regression of ``x.sum()``; validation logs ``mae`` and returns the MSE."""

    val_metric = "mae"
    return_val_loss = True
