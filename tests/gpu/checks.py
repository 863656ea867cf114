"""Run-level checks of the GPU proof kit: exact resume after SIGKILL with ``full_determinism=True`` (the
checkpoint tests' job, ``tests/checkpoint/job.py``, in fresh processes on the device), ``DeviceStatsMonitor``'s
values, and how long an async checkpoint save blocks the loop. Run by ``python tests/gpu/kit.py checks``.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from kit import REPO, Report


def _checkpoint_job() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_kit_checkpoint_job", os.path.join(REPO, "tests", "checkpoint",
                                                                                        "job.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def row_kill_resume(device: str) -> dict[str, Any]:
    """Uninterrupted run vs a run SIGKILLed after step 10 and resumed from checkpoint-8 (dropout, shuffling,
    accumulation 2): weights, optimizer state, logs and ``train_loss`` bitwise equal (``assert_same_run``)."""
    job = _checkpoint_job()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-kit-resume-"))
    cfg = {"save_steps": 4, "args": {"accelerator": device, "full_determinism": True}}
    ref = job.run_job({**cfg, "output_dir": str(tmp / "ref")}, tmp, "ref")
    job.run_job({**cfg, "kill_after_step": 10, "output_dir": str(tmp / "run")}, tmp, "killed", expect_kill=True)
    resumed = job.run_job({**cfg, "output_dir": str(tmp / "run")}, tmp, "resumed")
    job.assert_same_run(ref, resumed)
    return {"status": "pass", "global_step": ref["global_step"], "train_loss": ref["train_loss"],
            "resumed_from": "checkpoint-8", "bitwise": True}


def row_device_stats(device: str) -> dict[str, Any]:
    """``DeviceStatsMonitor`` logs ``device/...`` values on logging steps: on CUDA allocated and peak bytes > 0 and
    at most the device's memory; on the CPU the resident set size."""
    from taskfit import DeviceStatsMonitor, Fit, FitArguments

    job = _checkpoint_job()
    args = FitArguments(output_dir=tempfile.mkdtemp(prefix="gpu-kit-stats-"), max_steps=4, logging_steps=2,
                        per_device_train_batch_size=4, save_strategy="no", report_to="none", disable_tqdm=True,
                        accelerator=device)
    fit = Fit(args, callbacks=[DeviceStatsMonitor()])
    fit.fit(job.Net(), job.data())
    rows = [r for r in fit.state.log_history if any(k.startswith("device/") for k in r)]
    if not rows:
        return {"status": "fail", "reason": "no device/ values in the logs"}
    stats = {k: v for k, v in rows[-1].items() if k.startswith("device/")}
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        mem = [v for k, v in stats.items() if "bytes" in k or "allocated" in k or "reserved" in k]
        ok = bool(mem) and all(0 < v <= total for v in mem)
    else:
        ok = stats.get("device/cpu_rss_bytes", 0) > 0
    return {"status": "pass" if ok else "fail", "logging_rows": len(rows), **stats}


def row_async_checkpoint(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """A ``Fit`` run with ``plugins=[AsyncCheckpointIO()]`` saving every 2 of 6 steps of a wide MLP: the seconds
    the last save blocked the loop (wait + snapshot to host) against its background write, whether the snapshot's
    host tensors are pinned, and that the last checkpoint is complete (manifest written)."""
    from taskfit import Fit, FitArguments, TaskModule
    from taskfit.io import AsyncCheckpointIO
    from taskfit.io.async_checkpoint_io import snapshot

    h = sizes["ckpt_hidden"]

    # kept local: sized by the kit's config, large enough to time an async checkpoint
    class Wide(TaskModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(h, h) for _ in range(sizes["ckpt_layers"])])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

    io = AsyncCheckpointIO()
    out_dir = tempfile.mkdtemp(prefix="gpu-kit-async-")
    args = FitArguments(output_dir=out_dir, max_steps=6, save_steps=2, per_device_train_batch_size=8,
                        report_to="none", disable_tqdm=True, accelerator=device, logging_strategy="no")
    data = torch.utils.data.TensorDataset(torch.randn(48, h))
    start = time.perf_counter()
    Fit(args, plugins=[io]).fit(Wide(), data)
    fit_s = time.perf_counter() - start
    probe = snapshot({"t": torch.ones(4, device=device)})["t"]
    complete = os.path.exists(os.path.join(out_dir, "checkpoint-6", "manifest.json"))
    state_bytes = sum(p.numel() * 4 * 3 for p in Wide().parameters())  # weights + two AdamW moments, fp32
    return {"status": "pass" if complete else "fail", "blocking_s": io.last_blocking_seconds,
            "background_s": io.last_background_seconds, "fit_s": fit_s, "state_bytes": state_bytes,
            "snapshot_pinned": probe.is_pinned() if device == "cuda" else None, "checkpoint_complete": complete}


def run_part(report: Report, device: str, sizes: dict[str, Any]) -> None:
    report.run("exact resume after SIGKILL (full_determinism)", row_kill_resume, device)
    report.run("DeviceStatsMonitor values", row_device_stats, device)
    report.run("async checkpoint blocking time", row_async_checkpoint, device, sizes)
