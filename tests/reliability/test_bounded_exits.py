"""Bounded exits (F-REL-2): when a rank hangs (SIGSTOP) during a step, a checkpoint save or an evaluation, or when
the rendezvous port is taken, rank 0 raises ``DistributedError`` and every process of the job is gone within
``ddp_timeout`` plus a few seconds, on a machine whose cores are busy (two CPU burners run beside the job): workers
that do not exit are terminated, then killed, and reaped (checked with ``ps`` over the job's process group: no
orphans, no zombies). The slow suite runs many complete jobs under torchrun, taskfit's own launcher and spawn and
requires every one to exit 0 on every rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc import RJOB, clean_env, finish, start, wait_group_gone

pytestmark = pytest.mark.distributed
TIMEOUT = 10  # ddp_timeout of these jobs, seconds (less, and a worker's start-up on busy cores misses the rendezvous)
# beyond ddp_timeout, measured from the stop: rank 0 reaching the collective after rank 1 stopped, the error's path,
# killing the stopped worker, the bounded exit (3 s); the old code took 14.6 s here (5 s grace, 5 s of a SIGTERM a
# stopped worker never acts on, interpreter shutdown)
SLACK = 8
DDP = {"save_steps": 3, "args": {"max_steps": 8, "strategy": "ddp", "devices": 2, "ddp_timeout": TIMEOUT}}


@pytest.fixture
def busy_cores():
    """Two CPU burners (plain Python loops, no torch) for the length of the test: the bound must hold on a loaded
    machine, where interpreter shutdown alone takes seconds. Under ``make test`` (pytest-xdist) the other worker
    keeps the second core busy already, so one burner is enough there and the suite loses less time to it."""
    count = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    yield
    for b in burners:
        b.kill()
        b.wait()


@pytest.mark.parametrize("step,where", [  # the default run keeps one case; the save and evaluation ones are slow
    (1, "the next step's gradient all-reduce"),
    pytest.param(3, "the checkpoint save", marks=pytest.mark.slow),
    pytest.param(5, "the evaluation", marks=pytest.mark.slow)])
def test_F_REL_2_stopped_rank_ends_the_job_within_ddp_timeout(step, where, tmp_path, busy_cores):
    stamp = tmp_path / "stopped_at"
    proc, _ = start(RJOB, {**DDP, "output_dir": str(tmp_path / "out"), "resume": None, "stop_after_step": step,
                           "stop_rank": 1, "stopped_at": str(stamp)}, tmp_path, "stopped")
    rc, err, _ = finish(proc, 300)
    ended = time.time()
    assert rc != 0 and "DistributedError" in err, err[-3000:]
    assert stamp.exists(), f"rank 1 never reached step {step}"
    elapsed = ended - float(stamp.read_text())
    assert elapsed <= TIMEOUT + SLACK, f"rank 0 exited {elapsed:.1f} s after rank 1 stopped in {where}"
    assert wait_group_gone(proc.pid, 2) == []  # the stopped worker was killed and reaped: nothing left


def test_F_REL_2_busy_master_port_fails_fast_and_leaves_nothing(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        t0 = time.monotonic()
        proc, _ = start(RJOB, {**DDP, "output_dir": str(tmp_path / "out"), "resume": None}, tmp_path, "busy", env)
        rc, err, _ = finish(proc, 300)
        elapsed = time.monotonic() - t0
    assert rc != 0 and "Could not form the process group" in err and str(port) in err, err[-3000:]
    assert elapsed <= TIMEOUT + SLACK + 20  # + interpreter start-up of both processes
    assert wait_group_gone(proc.pid, 2) == []


JOB = Path(__file__).resolve().parent.parent / "strategies" / "ddp_job.py"


def _launch(kind: str, tmp: Path, i: int) -> subprocess.Popen:
    import json

    cfg = {"out": str(tmp / f"o{i}"), "result": str(tmp / f"r{i}.pt"), "bs": 4, "steps": 2,
           "strategy": "ddp_spawn" if kind == "spawn" else "ddp", "devices": 2}
    path = tmp / f"c{i}.json"
    path.write_text(json.dumps(cfg))
    if kind == "torchrun":
        from taskfit.strategies.environments import find_free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               f"--master-port={find_free_port()}", str(JOB), str(path)]
    elif kind == "spawn":
        cmd = [sys.executable, "-c", f"import sys, runpy; sys.argv = ['ddp_job.py', {str(path)!r}]; "
               f"sys.path.insert(0, {str(JOB.parent)!r}); import ddp_job, json; "
               f"ddp_job.run(json.load(open({str(path)!r})))"]
    else:
        cmd = [sys.executable, str(JOB), str(path)]
    return subprocess.Popen(cmd, env=clean_env(), cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 30 jobs of 15-25 s each on a loaded 2-core machine
@pytest.mark.parametrize("kind", ["torchrun", "self-launched", "spawn"])
def test_F_REL_2_finished_jobs_exit_0_on_every_rank_every_time(kind, tmp_path):
    """30 complete 2-process jobs per launcher: every process exits 0 (no 'terminate called without an active
    exception' abort at interpreter exit) and nothing is left running."""
    failures = []
    for i in range(int(os.environ.get("TASKFIT_EXIT_RUNS", "30"))):
        proc = _launch(kind, tmp_path, i)
        rc, err, _ = finish(proc, 240)
        if rc != 0 or "terminate called" in err:
            failures.append((i, rc, err[-1500:]))
        left = wait_group_gone(proc.pid, 5)
        assert left == [], left
    assert failures == []
