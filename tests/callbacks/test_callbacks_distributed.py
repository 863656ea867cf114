"""F-LIT-6: the built-in callbacks under DDP (2 processes, gloo), FSDP and DeepSpeed, several together in one run,
checked against one process on the same global batch: ModelCheckpoint keeps the same top-k folders, the
LearningRateMonitor logs the same rates, EarlyStopping stops at the same epoch, the EMA weights that
``save_model`` writes are the single-process ones within 1e-6, and only rank 0 prints the model summary and draws
the progress bar. Weight averaging refuses sharded parameters (FSDP) with a clear error.

This file is also the job: ``python test_callbacks_distributed.py CONFIG.json`` (taskfit re-launches it per rank).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # jobs_common, also when run as a job script
from jobs_common import job_main, run_job  # noqa: E402

HERE = Path(__file__)
GLOBAL_BATCH = 8
EPOCHS = 5


def _dataset(n: int = 32, seed: int = 0):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3 * torch.randn(n, 1, generator=g))


def _module():
    from taskfit import TaskModule

    # kept local: a hidden layer, an epoch-scripted val_score and a StepLR schedule the callbacks act on
    class Net(TaskModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            # a value that rises after epoch 1: EarlyStopping(patience=1) has something to stop on
            score = loss + 0.5 * (self.fit.state.current_epoch - 1) ** 2
            self.log("val_score", score, sync_dist=True)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3, 0.5),
                                                       "interval": "step"}}
    return Net


def job(cfg: dict) -> dict:
    from taskfit import Callback, Fit
    from taskfit.callbacks import (EarlyStopping, EMAWeightAveraging, LearningRateMonitor, ModelCheckpoint,
                                   ModelSummary, ProgressBar, Timer)

    bar = ProgressBar()
    drawn = []

    class Watch(Callback):  # whether this rank's bar exists while training
        def on_train_epoch_end(self, fit, module):
            drawn.append(bar.train_bar is not None)

    ckpt = ModelCheckpoint(dirpath=os.path.join(cfg["out"], "ck"), monitor="val_score", mode="min", save_top_k=2,
                           filename="{epoch}")
    lr_monitor = LearningRateMonitor(logging_interval="step")
    callbacks = [bar, Watch(), ckpt, lr_monitor,
                 EarlyStopping(monitor="val_score", patience=1), Timer(duration="00:01:00:00"),
                 ModelSummary(max_depth=2)]
    if cfg.get("ema", True):
        callbacks.append(EMAWeightAveraging(decay=0.8))
    world = cfg.get("devices", 1)
    fit = Fit(callbacks=callbacks, output_dir=cfg["out"], report_to="none", save_strategy="no",
              eval_strategy="epoch", num_train_epochs=EPOCHS, per_device_train_batch_size=GLOBAL_BATCH // world,
              per_device_eval_batch_size=4, logging_steps=1, max_grad_norm=0, seed=3, disable_tqdm=False,
              strategy=cfg.get("strategy", "auto"), devices=world, ddp_timeout=120, **cfg.get("args", {}))
    torch.manual_seed(0)
    module = _module()()
    out, err = io.StringIO(), io.StringIO()
    result: dict = {"rank": int(os.environ.get("RANK", "0"))}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            fit.fit(module, _dataset(), _dataset(16, seed=1))
            fit.save_model(os.path.join(cfg["out"], "export"))
    except ValueError as exc:
        result["error"] = str(exc)
        return result
    result.update(
        rank=fit.global_rank, world_size=fit.world_size, drawn=drawn, stdout=out.getvalue(), stderr=err.getvalue(),
        kept=sorted(os.listdir(ckpt.dirpath)) if fit.is_global_zero else None,
        best=(os.path.basename(ckpt.best_model_path), float(ckpt.best_model_score)) if fit.is_global_zero else None,
        lrs={k: list(v) for k, v in lr_monitor.lrs.items()},
        stopped_epoch=fit.state.current_epoch, steps=fit.state.global_step)
    return result


def _run(tmp_path: Path, name: str, cfg: dict) -> list[dict]:
    return run_job(HERE, tmp_path, name, cfg, timeout=500)


def _exported(tmp_path: Path, name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(tmp_path / name / "export" / "model.safetensors"))


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    (r,) = _run(tmp, "single", {})
    return r, _exported(tmp, "single")


@pytest.fixture(scope="module")
def single_without_ema(tmp_path_factory):
    """The reference for sharded runs, which refuse weight averaging (validation then sees the raw weights)."""
    tmp = tmp_path_factory.mktemp("single_without_ema")
    (r,) = _run(tmp, "single", {"ema": False})
    return r


def _same_as_single(runs: list[dict], single: dict) -> None:
    r0, r1 = runs
    assert r0["kept"] == single["kept"] and len(single["kept"]) == 2  # the same top-2 folders
    assert r0["best"][0] == single["best"][0]
    assert r0["best"][1] == pytest.approx(single["best"][1], abs=1e-5)
    assert r0["lrs"] == r1["lrs"] == single["lrs"] and len(set(single["lrs"]["lr-SGD"])) > 1  # the StepLR series
    assert r0["stopped_epoch"] == r1["stopped_epoch"] == single["stopped_epoch"] < EPOCHS - 1  # stopped early
    assert r0["steps"] == single["steps"]
    # only rank 0 prints the layer table and draws the bar
    assert "Trainable params" in r0["stdout"] and "Trainable params" not in r1["stdout"]
    assert r0["drawn"] and all(r0["drawn"]) and not any(r1["drawn"])
    assert "Epoch" in r0["stderr"] and "Epoch" not in r1["stderr"]


@pytest.mark.slow
@pytest.mark.distributed
def test_callbacks_under_ddp_equal_one_process_F_LIT_6(tmp_path, single):
    ref, ref_weights = single
    runs = _run(tmp_path, "ddp", {"strategy": "ddp", "devices": 2})
    _same_as_single(runs, ref)
    weights = _exported(tmp_path, "ddp")  # the EMA weights save_model wrote
    for k, v in ref_weights.items():
        torch.testing.assert_close(weights[k], v, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_callbacks_under_fsdp_equal_one_process_F_LIT_6(tmp_path, single_without_ema):
    ref = single_without_ema
    refused = _run(tmp_path, "fsdp_ema", {"strategy": "fsdp", "devices": 2})
    assert all("does not support sharded parameters (FSDPStrategy)" in r["error"] for r in refused)
    runs = _run(tmp_path, "fsdp", {"strategy": "fsdp", "devices": 2, "ema": False})
    _same_as_single(runs, ref)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.deepspeed
def test_callbacks_under_deepspeed_equal_one_process_F_LIT_6(tmp_path, single):
    pytest.importorskip("deepspeed")
    ref, ref_weights = single
    runs = _run(tmp_path, "ds", {"strategy": "deepspeed_stage_2", "devices": 2})
    _same_as_single(runs, ref)
    weights = _exported(tmp_path, "ds")
    for k, v in ref_weights.items():
        torch.testing.assert_close(weights[k], v, rtol=0, atol=1e-6)


if __name__ == "__main__":
    job_main(job)
