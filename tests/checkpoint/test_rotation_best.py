"""``save_total_limit=1`` with ``load_best_model_at_end`` and an early best (issue 30): during the run rotation
keeps both the newest complete checkpoint and the best one, so a run that stops before its end (here it fails at
a step; a SIGKILL leaves the disk as the last rotation did) never loses its newest; a finished run keeps the best
one alone (HF 5's ``save_total_limit=1`` rule), as docs/checkpoints.md says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import job

from taskfit import Callback, Fit


class FailAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
        if fit.state.global_step == self.step:
            raise RuntimeError("stopped")


def _fit(out: Path, **kw) -> Fit:
    # greater_is_better=True on a falling val_mse: the first evaluation stays the best
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, max_steps=8, eval_strategy="steps", eval_steps=2, save_steps=2,
               save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="val_mse",
               greater_is_better=True, **kw)


def _complete(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*") if (p / "manifest.json").exists())


def test_F_CKPT_3_a_stopped_run_keeps_its_newest_and_its_best(tmp_path):
    out = tmp_path / "out"
    torch.manual_seed(0)
    net = job.Net()  # before Fit(...), which seeds with its own seed (HF's Trainer.__init__)
    with pytest.raises(RuntimeError, match="stopped"):
        _fit(out, callbacks=[FailAt(7)]).fit(net, job.data(), eval_data=job.data(16, seed=1))
    newest = out / "checkpoint-6"
    best = json.loads((newest / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert best.endswith("checkpoint-2")  # the early best
    assert _complete(out) == ["checkpoint-2", "checkpoint-6"]


def test_F_CKPT_3_a_finished_run_keeps_the_best_alone(tmp_path):
    out = tmp_path / "out"
    torch.manual_seed(0)
    net = job.Net()  # before Fit(...), which seeds with its own seed (HF's Trainer.__init__)
    result = _fit(out).fit(net, job.data(), eval_data=job.data(16, seed=1))
    assert result.metrics["best_model_checkpoint"].endswith("checkpoint-2")
    assert _complete(out) == ["checkpoint-2"]
