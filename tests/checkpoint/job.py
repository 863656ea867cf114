"""A small real training job used by the checkpoint tests, in-process and as a subprocess that may be killed.

Run as ``python job.py CONFIG.json``: trains (resuming with ``resume_from_checkpoint=True``), optionally SIGKILLs
itself after a given optimizer step or in the middle of writing a given checkpoint, and writes the final weights,
optimizer state and log history to ``config["result"]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jobs_common import KillAfterStep  # noqa: E402

from taskfit import Callback, Fit, TaskModule  # noqa: E402
from taskfit.io import TorchCheckpointIO  # noqa: E402

SPEED_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
              "eval_samples_per_second", "eval_steps_per_second")


# kept local: dropout makes the restored RNG matter; the logged names are what resume compares
class Net(TaskModule):
    """Linear -> dropout -> ReLU -> linear regression; logs a step+epoch metric and an eval loss."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.body(x), y)
        self.log("train_mse", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", nn.functional.mse_loss(self.body(x), y))


def data(n: int = 50, seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g))


class KillAfterSave(Callback):
    """Kill right after the checkpoint of ``step`` was written (HF ``on_save`` hook)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class KillDuringSave(TorchCheckpointIO):
    """Writes the files of the checkpoint of ``step`` one by one and SIGKILLs the process half-way through."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_files(self, files, folder, finalize=None):
        if folder.rstrip("/").rsplit("/", 1)[-1].startswith(f"checkpoint-{self.step}"):
            names = list(files)
            super().save_files({n: files[n] for n in names[: len(names) // 2]}, folder, None)
            os.kill(os.getpid(), signal.SIGKILL)
        super().save_files(files, folder, finalize)


def make_fit(cfg: dict) -> Fit:
    callbacks, plugins = [], []
    if cfg.get("kill_after_step"):
        callbacks.append(KillAfterStep(cfg["kill_after_step"]))
    if cfg.get("kill_after_save"):
        callbacks.append(KillAfterSave(cfg["kill_after_save"]))
    if cfg.get("kill_during_save"):
        plugins.append(KillDuringSave(cfg["kill_during_save"]))
    kwargs = dict(output_dir=cfg["output_dir"], per_device_train_batch_size=4, per_device_eval_batch_size=8,
                  gradient_accumulation_steps=cfg.get("accum", 2), num_train_epochs=3, learning_rate=0.05,
                  logging_steps=2, eval_strategy="steps", eval_steps=5, save_strategy=cfg.get("save_strategy", "steps"),
                  save_steps=cfg.get("save_steps", 4), dataloader_num_workers=cfg.get("workers", 0), seed=7,
                  report_to="none", disable_tqdm=True, max_grad_norm=1.0, warmup_steps=2)
    kwargs.update(cfg.get("args", {}))
    return Fit(callbacks=callbacks, plugins=plugins, **kwargs)


def run(cfg: dict) -> dict:
    fit = make_fit(cfg)
    torch.manual_seed(0)  # the model's init does not depend on the run's seed handling
    module = Net()
    out = fit.fit(module, data(), data(16, seed=1), resume_from_checkpoint=cfg.get("resume", True))
    return {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
            "optimizer": fit.optimizer.state_dict(),
            "log_history": [{k: v for k, v in row.items() if k not in SPEED_KEYS} for row in fit.state.log_history],
            "train_loss": out.training_loss, "global_step": fit.state.global_step}


def run_job(cfg: dict, tmp_path: Path, name: str, env: dict | None = None, expect_kill: bool = False) -> dict | None:
    """Run ``job.py`` with ``cfg`` in a fresh process; returns its result dict, or None when it was killed."""
    cfg = {**cfg, "result": str(tmp_path / f"{name}.pt")}
    cfg_path = tmp_path / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(Path(__file__)), str(cfg_path)], env=full_env, capture_output=True, text=True,
                          timeout=300)
    if expect_kill:
        assert proc.returncode == -9, f"expected SIGKILL, got rc={proc.returncode}\n{proc.stderr[-3000:]}"
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(cfg["result"], weights_only=True)


def assert_same_run(ref: dict, got: dict) -> None:
    """Bitwise-equal weights and optimizer state, equal logged metrics and training loss."""
    assert ref["global_step"] == got["global_step"]
    for k, v in ref["weights"].items():
        assert torch.equal(v, got["weights"][k]), k
    for pid, st in ref["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(got["optimizer"]["state"][pid][k])), (pid, k)
    assert ref["log_history"] == got["log_history"]
    assert ref["train_loss"] == got["train_loss"]


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = run(cfg)
    if os.environ.get("RANK", "0") == "0":  # under DDP every rank runs this; rank 0 reports
        torch.save(result, cfg["result"])
