"""The checkpoint tests' job (``tests/checkpoint/job.py``) with the reliability suite's extra faults, run as
``python rjob.py CONFIG.json`` (one process, or one per rank under DDP):

- ``slow_io``: seconds the checkpoint IO sleeps before writing each file (so a kill lands inside a save);
- ``async``: save through ``AsyncCheckpointIO`` (wrapping the slow IO when given);
- ``kill_after_step`` / ``kill_after_save``: SIGKILL this process (rank ``kill_rank``, default every rank);
- ``stop_after_step``: rank ``stop_rank`` writes the time to ``stopped_at`` and SIGSTOPs itself (a hung rank);
- ``file_size_limit``: bytes, set as ``RLIMIT_FSIZE`` once step ``limit_after_step`` is done (a disk that fills up);
- ``report_threads``: a path prefix; when ``fit`` returns, every rank writes the names of the Python threads alive
  then besides the main thread (``threading.enumerate()``) to ``<prefix>.rank<R>.json`` and prints them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402
from job import SPEED_KEYS, Net, data  # noqa: E402,F401

from taskfit import Callback, Fit  # noqa: E402
from taskfit.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402


class SlowIO(TorchCheckpointIO):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def write_bytes(self, path: str, data: bytes) -> None:
        time.sleep(self.delay)
        super().write_bytes(path, data)


class Kill(Callback):
    def __init__(self, after_step: int | None, after_save: int | None, rank: int | None) -> None:
        self.after_step, self.after_save, self.rank = after_step, after_save, rank

    def _mine(self) -> bool:
        return self.rank is None or int(os.environ.get("RANK", "0")) == self.rank

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.after_step and self._mine():
            os.kill(os.getpid(), signal.SIGKILL)

    def on_save(self, args, state, control, **kw):
        if state.global_step == self.after_save and self._mine():
            os.kill(os.getpid(), signal.SIGKILL)


class Stop(Callback):
    def __init__(self, step: int, rank: int, stamp: str) -> None:
        self.step, self.rank, self.stamp = step, rank, stamp

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step and int(os.environ.get("RANK", "0")) == self.rank:
            Path(self.stamp).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)


class DiskFull(Callback):
    def __init__(self, step: int, limit: int) -> None:
        self.step, self.limit = step, limit

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            import resource

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.limit))


def make_fit(cfg: dict) -> Fit:
    base = job.make_fit({k: v for k, v in cfg.items() if not k.startswith("kill")})
    plugins: list = []
    inner = SlowIO(cfg["slow_io"]) if cfg.get("slow_io") else None
    if cfg.get("async"):
        plugins.append(AsyncCheckpointIO(inner))
    elif inner is not None:
        plugins.append(inner)
    callbacks = [Kill(cfg.get("kill_after_step"), cfg.get("kill_after_save"), cfg.get("kill_rank"))]
    if cfg.get("file_size_limit"):
        callbacks.append(DiskFull(cfg["limit_after_step"], cfg["file_size_limit"]))
    if cfg.get("stop_after_step"):
        callbacks.append(Stop(cfg["stop_after_step"], cfg.get("stop_rank", 1), cfg["stopped_at"]))
    return Fit(base.args, plugins=plugins, callbacks=callbacks)


def run(cfg: dict) -> dict:
    fit = make_fit(cfg)
    torch.manual_seed(0)
    module = Net()
    out = fit.fit(module, data(), data(16, seed=1), resume_from_checkpoint=cfg.get("resume", True))
    if cfg.get("report_threads"):
        alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        rank = os.environ.get("RANK", "0")
        print(f"threads alive after fit on rank {rank}: {alive}", flush=True)
        Path(f"{cfg['report_threads']}.rank{rank}.json").write_text(json.dumps(alive))
    return {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
            "optimizer": fit.optimizer.state_dict(),
            "log_history": [{k: v for k, v in row.items() if k not in SPEED_KEYS} for row in fit.state.log_history],
            "train_loss": out.training_loss, "global_step": fit.state.global_step}


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = run(cfg)
    if os.environ.get("RANK", "0") == "0":
        torch.save(result, cfg["result"])
