"""A default training script for the console tests: ``python console_job.py '{"option": value, ...}'`` trains a
small regression with the given ``Fit`` options and nothing else (no logging set-up of its own)."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import SumRegression, sum_data  # noqa: E402

from taskfit import Fit  # noqa: E402


class Net(SumRegression):
    """Logs ``val_mae`` in validation."""


if __name__ == "__main__":
    options = json.loads(sys.argv[1])
    if options.pop("basic_config", False):  # the application's own logging set-up
        import logging

        logging.basicConfig(level=logging.INFO, format="APP %(name)s %(message)s")
    options = {"output_dir": "out", "max_steps": 6, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 3,
               "per_device_train_batch_size": 2, "save_strategy": "no", **options}
    Fit(**options).fit(Net(), sum_data(16), sum_data(8, 1))
