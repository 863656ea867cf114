"""Running the reliability jobs in fresh process groups: a hang is killed (the whole group) and reported as a
failure, never left behind; ``descendants`` lists what a job left running (``ps``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RJOB = HERE / "rjob.py"
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED",
              "SLURM_NTASKS", "TORCHELASTIC_RUN_ID")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "TASKFIT_DEEPSPEED_SHM_COMM": "0", **extra}


def group_members(pgid: int) -> list[tuple[int, str, str]]:
    """``[(pid, state, command)]`` of every live process in process group ``pgid`` (zombies included), from ps."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and int(parts[1]) == pgid:
            rows.append((int(parts[0]), parts[2], parts[3] if len(parts) > 3 else ""))
    return rows


def start(script: Path, cfg: dict, tmp: Path, name: str, env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    cfg = {**cfg, "result": str(tmp / f"{name}.pt")}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, str(script), str(path)], env=env or clean_env(), cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, cfg


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    """Wait at most ``timeout`` s; on a hang kill the whole group and fail. Returns (rc, stderr, seconds)."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"the job hung for more than {timeout:.0f} s; stderr tail:\n{err[-3000:]}") from None
    return proc.returncode, err, time.monotonic() - t0


def run(script: Path, cfg: dict, tmp: Path, name: str, timeout: float = 300, expect_kill: bool = False,
        env: dict | None = None) -> dict | None:
    """Run a job to its end (or its SIGKILL with ``expect_kill``); returns rank 0's result dict."""
    proc, cfg = start(script, cfg, tmp, name, env)
    rc, err, _ = finish(proc, timeout)
    leftovers = [m for m in group_members(proc.pid)]
    if leftovers:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not leftovers, f"processes left behind: {leftovers}"
    if expect_kill:
        assert rc == -9, f"expected SIGKILL, got rc={rc}\n{err[-3000:]}"
        return None
    assert rc == 0, err[-3000:]
    return torch.load(cfg["result"], weights_only=True)


def complete_checkpoints(out: str | Path) -> list[int]:
    out = Path(out)
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")
                  if p.name.split("-")[1].isdigit() and (p / "manifest.json").exists())


def wait_group_gone(pgid: int, timeout: float) -> list[tuple[int, str, str]]:
    """Poll ``ps`` until no process of group ``pgid`` is left (or ``timeout`` s passed); returns the leftovers
    (then killed, so a failing test leaves nothing behind)."""
    deadline = time.monotonic() + timeout
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
