"""Issue 31: a ``configure_optimizers`` the user wrote that returns ``None`` trains with the default optimizer built
from the arguments; that is said in a warning (Lightning warns too), while a module that does not override
``configure_optimizers`` gets the default silently."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
from taskfit import Fit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import SumRegression, sum_data


class ReturnsNone(SumRegression):
    def configure_optimizers(self):
        self.configured = True  # e.g. an optimizer built but not returned


def _fit(tmp_path, module):
    fit = Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no", max_steps=2,
              per_device_train_batch_size=4, learning_rate=0.05)
    fit.fit(module, sum_data(8))


def test_configure_optimizers_returning_none_warns(tmp_path):
    with pytest.warns(UserWarning, match=r"configure_optimizers.*returned None.*default optimizer"):
        _fit(tmp_path, ReturnsNone())


def test_default_configure_optimizers_is_silent(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(tmp_path, SumRegression())
    assert not [w for w in caught if "configure_optimizers" in str(w.message)]
