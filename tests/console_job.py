"""A default training script for the console tests: ``python console_job.py '{"option": value, ...}'`` trains a
small regression with the given ``Fit`` options and nothing else (no logging set-up of its own)."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from taskfit import Fit, TaskModule


class Net(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mae", (self.layer(x).squeeze(-1) - y).abs().mean())


def data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1))


if __name__ == "__main__":
    options = json.loads(sys.argv[1])
    if options.pop("basic_config", False):  # the application's own logging set-up
        import logging

        logging.basicConfig(level=logging.INFO, format="APP %(name)s %(message)s")
    options = {"output_dir": "out", "max_steps": 6, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 3,
               "per_device_train_batch_size": 2, "save_strategy": "no", **options}
    Fit(**options).fit(Net(), data(16), data(8, 1))
