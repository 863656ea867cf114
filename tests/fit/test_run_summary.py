"""The run summary (F-OBS-4) shows the batch the run really trains on: a DataModule's loader, or a loader with its
own batch sampler, batches differently from ``per_device_train_batch_size``."""

from __future__ import annotations

import logging

import torch
from helpers.models import Regression
from taskfit import DataModule, Fit
from taskfit.fit.summary import loader_batch_size
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset


def _data(n=24):
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(-1))


class Loaders(DataModule):
    def train_dataloader(self):
        return DataLoader(_data(), batch_size=6)


def test_F_OBS_4_summary_shows_the_datamodule_loaders_batch_size_not_the_arguments(tmp_path, caplog):
    """per_device_train_batch_size=8 (arguments) but the DataModule's loader batches 6: the summary says 6 per device
    and 6 x 2 accumulation = 12 samples per optimizer step, in the dict and in the logged text."""
    fit = Fit(output_dir=str(tmp_path), accelerator="cpu", max_steps=2, per_device_train_batch_size=8,
              gradient_accumulation_steps=2, save_strategy="no", report_to="none", disable_tqdm=True)
    with caplog.at_level(logging.INFO, logger="taskfit"):
        fit.fit(Regression(features=4), datamodule=Loaders())
    assert fit.summary["per_device_batch_size"] == 6
    assert fit.summary["effective_batch_size"] == 12
    assert "6 per device x 2 accumulation x 1 process(es) = 12 samples per optimizer step" in caplog.text


def test_F_OBS_4_loader_batch_size_reads_the_batch_sampler_and_knows_when_it_cannot():
    data = _data()
    assert loader_batch_size(DataLoader(data, batch_size=5)) == 5
    custom = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), batch_size=3, drop_last=False))
    assert custom.batch_size is None and loader_batch_size(custom) == 3
    assert loader_batch_size(DataLoader(data, batch_size=None)) is None  # the dataset yields whole batches
    assert loader_batch_size(data) is None
