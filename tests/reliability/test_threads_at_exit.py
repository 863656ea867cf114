"""No thread started by taskfit outlives ``fit`` (F-REL-2): background checkpoint saves (``AsyncCheckpointIO``),
the hashing of backend-written shards (FSDP's torch.distributed.checkpoint files), the TensorBoard logger's
event-file writer and the graceful-stop flag's
all-reduce are all finished and joined when ``fit`` returns, so nothing of taskfit's is left running when the
interpreter exits (a joinable thread or an in-flight gloo work at exit is what aborts a process with
"terminate called without an active exception"). In-process for one process (default run); every rank of 2-process
DDP and FSDP jobs, self-launched and under torchrun, prints ``threading.enumerate()`` after ``fit`` and the test
reads it (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from proc import RJOB, clean_env, finish, wait_group_gone

from taskfit import Fit
from taskfit.io import AsyncCheckpointIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


def _others() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t is not threading.main_thread()}


@pytest.mark.parametrize("kind", ["async", "fsdp", "tensorboard"])
def test_F_REL_2_no_taskfit_thread_is_alive_after_fit(kind, tmp_path):
    before = _others()
    kw = {"async": {"plugins": [AsyncCheckpointIO()]}, "fsdp": {"strategy": "fsdp", "devices": 1},
          "tensorboard": {"report_to": "tensorboard", "logging_steps": 1}}[kind]  # TensorBoard: a writer thread
    fit = Fit(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4, save_steps=2,
              disable_tqdm=True, **{"report_to": "none", **kw})
    torch.manual_seed(0)
    fit.fit(job.Net(), job.data())
    assert (tmp_path / "out" / "checkpoint-4" / "manifest.json").exists()
    left = [t.name for t in _others() - before]
    assert left == [], f"threads still alive after fit: {left}"


def _launch(cmd: list[str], tmp: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=clean_env(), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("launch,strategy", [("self", "ddp"), ("self", "fsdp"), ("torchrun", "ddp")])
def test_F_REL_2_no_thread_is_alive_after_fit_on_any_rank(launch, strategy, tmp_path):
    cfg = {"output_dir": str(tmp_path / "out"), "resume": None, "save_steps": 3, "async": strategy == "ddp",
           "report_threads": str(tmp_path / "threads"), "result": str(tmp_path / "result.pt"),
           "args": {"max_steps": 6, "strategy": strategy, "devices": 2, "ddp_timeout": 60}}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    if launch == "torchrun":
        from taskfit.strategies.environments import find_free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               f"--master-port={find_free_port()}", str(RJOB), str(path)]
    else:
        cmd = [sys.executable, str(RJOB), str(path)]
    proc = _launch(cmd, tmp_path)
    rc, err, _ = finish(proc, 300)
    assert wait_group_gone(proc.pid, 10) == []
    assert rc == 0 and "terminate called" not in err, err[-3000:]
    for rank in (0, 1):
        alive = json.loads((tmp_path / f"threads.rank{rank}.json").read_text())
        assert alive == [], f"rank {rank}: threads still alive after fit: {alive}"
