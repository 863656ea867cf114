"""Two runs on one ``output_dir`` (issue 30): while a run trains, a second run started on the same ``output_dir``
refuses to start, naming the first (pid and host); the lock does not outlive its process: after the first run is
SIGKILLed a new run starts and resumes from its newest checkpoint. Real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from proc import clean_env

from taskfit import Fit
from taskfit.io.run_lock import run_lock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402

LOCK_JOB = Path(__file__).resolve().parent / "lock_job.py"


def _start(out: Path, steps: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(LOCK_JOB), str(out), str(steps), str(seconds)], env=clean_env(),
                            cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_started(proc: subprocess.Popen, marker: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the first run ended early: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "the first run did not start training"
        time.sleep(0.2)


def test_F_REL_9_a_second_run_on_the_same_output_dir_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    out = tmp_path / "out"
    first = _start(out, steps=1000, seconds=0.5)
    try:
        _wait_started(first, tmp_path / f"started-{first.pid}")
        second = _start(out, steps=2, seconds=0)
        _, err = second.communicate(timeout=240)
        assert second.returncode != 0
        assert "RunLockedError" in err and f"pid {first.pid}" in err and socket.gethostname() in err, err[-2000:]
        assert not (tmp_path / f"started-{second.pid}").exists()  # it never trained
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    steps_before = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "manifest.json").exists())
    third = _start(out, steps=steps_before + 2, seconds=0)
    stdout, err = third.communicate(timeout=240)
    assert third.returncode == 0, err[-3000:]
    assert f"DONE {steps_before + 2}" in stdout
    assert not (out / ".taskfit-run.lock").exists()  # released at the end of the run


def test_F_REL_9_the_lock_is_released_after_a_run_and_reentrant_in_its_process(tmp_path):
    """Released after a run; a run started inside a run of the same process (the finder callbacks, HPO trials)
    is that run's own work and is not refused (another process is: the test above)."""
    out = tmp_path / "out"
    torch.manual_seed(0)
    Fit(output_dir=str(out), per_device_train_batch_size=4, max_steps=2, report_to="none",
        disable_tqdm=True).fit(job.Net(), job.data())
    assert not (out / ".taskfit-run.lock").exists()
    with run_lock(str(out)) as held:
        assert held and (out / ".taskfit-run.lock").exists()
        out_inner = Fit(output_dir=str(out), per_device_train_batch_size=4, max_steps=2, report_to="none",
                        disable_tqdm=True).fit(job.Net(), job.data())
        assert out_inner.global_step == 2
        assert (out / ".taskfit-run.lock").exists()  # the outer holder still holds it
    assert not (out / ".taskfit-run.lock").exists()


def test_F_REL_9_a_remote_output_dir_is_not_locked(tmp_path):
    """fsspec stores have no lock a killed process releases: no lock is taken (documented in docs/checkpoints.md)."""
    with run_lock("memory://rel2-lock/out") as held, run_lock("memory://rel2-lock/out") as again:
        assert held is False and again is False
