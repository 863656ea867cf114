"""DeviceStatsMonitor (F-ACC-2, F-OBS-2): the accelerator's device statistics reach the loggers on logging steps."""

from __future__ import annotations

import csv

import torch
from helpers.models import Regression
from taskfit import DeviceStatsMonitor, Fit


def test_F_ACC_2_device_stats_logged_on_logging_steps_only(tmp_path):
    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    monitor = DeviceStatsMonitor()
    fit = Fit(output_dir=str(tmp_path), max_steps=6, logging_steps=3, per_device_train_batch_size=4,
              save_strategy="no", disable_tqdm=True, report_to="csv", callbacks=[monitor])
    fit.fit(Regression(features=4, seed=None), data)
    rows = [r for r in fit.state.log_history if "device/cpu_rss_bytes" in r]
    assert [r["step"] for r in rows] == [3, 6]  # logging steps only
    assert all(r["device/cpu_rss_bytes"] > 50 * 2**20 for r in rows)  # a Python process with torch: > 50 MiB
    with open(tmp_path / "logs" / "metrics.csv") as f:
        logged = [r for r in csv.DictReader(f) if r.get("device/cpu_rss_bytes")]
    assert [int(r["step"]) for r in logged] == [3, 6]
