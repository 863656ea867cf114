"""F-REL-1 / F-OBS-5: graceful stop on SIGTERM, Ctrl-C (SIGINT) and SLURM's requeue signal, on real processes.
The stopped run finishes its optimizer step, writes a complete checkpoint (``save_on_interrupt``), names it with
the resume command, exits with ``128 + signal``; resuming from it ends equal to the run that never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from job import assert_same_run  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "interrupt_job.py")


def _start(cfg: dict, tmp_path, name: str, env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    cfg = {**cfg, "result": str(tmp_path / f"{name}.pt"), "started": str(tmp_path / f"{name}.started")}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, JOB, str(path)], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, cfg


def _run(cfg: dict, tmp_path, name: str, rc: int = 0, env: dict | None = None) -> tuple[str, dict | None]:
    proc, cfg = _start(cfg, tmp_path, name, env)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == rc, err[-3000:]
    return err, (torch.load(cfg["result"], weights_only=True) if rc == 0 else None)


def _complete(out: str) -> list[int]:
    return sorted(int(d.split("-")[1]) for d in os.listdir(out)
                  if d.startswith("checkpoint-") and os.path.exists(os.path.join(out, d, "manifest.json")))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    return _run({"output_dir": str(tmp / "out"), "resume": None}, tmp, "ref")[1]


def test_F_REL_1_sigterm_checkpoints_the_step_and_resume_equals_uninterrupted(tmp_path, reference):
    out = str(tmp_path / "out")
    err, _ = _run({"output_dir": out, "signal_at_step": 5}, tmp_path, "stopped", rc=128 + signal.SIGTERM)
    # the flag is read at the end of each step: the signal sent during step 5's hooks stops after step 6
    assert _complete(out) == [4, 6]
    ckpt = os.path.join(out, "checkpoint-6")
    assert f"Received SIGTERM: stopped after optimizer step 6; the last complete checkpoint is {ckpt}" in err
    assert f"Resume with: python {JOB}" in err and "Traceback" not in err
    _, resumed = _run({"output_dir": out}, tmp_path, "resumed")
    assert_same_run(reference, resumed)


def test_F_REL_1_sigint_from_outside_with_save_on_interrupt(tmp_path, reference):
    """Ctrl-C sent by another process at an arbitrary moment of a paced run; ``save_on_interrupt=True``."""
    out = str(tmp_path / "out")
    proc, cfg = _start({"output_dir": out, "slow": 0.3, "args": {"save_on_interrupt": True, "save_steps": 100}},
                       tmp_path, "stopped")
    deadline = time.monotonic() + 300
    while not os.path.exists(cfg["started"]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    (step,) = _complete(out)  # save_steps=100: the only checkpoint is the interrupt's
    assert 3 <= step < 21 and f"stopped after optimizer step {step}" in err
    _, resumed = _run({"output_dir": out, "args": {"save_steps": 100}}, tmp_path, "resumed")
    assert_same_run(reference, resumed)


def test_F_REL_1_ctrl_c_by_default_stops_without_a_new_checkpoint(tmp_path):
    out = str(tmp_path / "out")
    err, _ = _run({"output_dir": out, "signal_at_step": 5, "signal": "SIGINT"}, tmp_path, "stopped",
                  rc=128 + signal.SIGINT)
    assert _complete(out) == [4]
    assert "Received SIGINT: stopped after optimizer step 6; the last complete checkpoint is" in err
    assert "checkpoint-4" in err


def test_F_REL_1_slurm_sigusr1_checkpoints_and_requeues(tmp_path):
    """Under SLURM (``SLURM_JOB_ID``; ``sbatch --signal=USR1@90``) SIGUSR1 saves and runs ``scontrol requeue``;
    a fake ``scontrol`` on PATH records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.args"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {record}\n")
    (bin_dir / "scontrol").chmod(0o755)
    out = str(tmp_path / "out")
    env = {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    err, _ = _run({"output_dir": out, "signal_at_step": 5, "signal": "SIGUSR1"}, tmp_path, "stopped",
                  rc=128 + signal.SIGUSR1, env=env)
    assert _complete(out) == [4, 6]
    assert record.read_text().split() == ["requeue", "4242"]
    assert "Requeued SLURM job 4242" in err


@pytest.mark.distributed
def test_F_REL_1_ddp_sigterm_to_rank_zero_stops_every_rank(tmp_path):
    """Self-launched DDP (2 processes): SIGTERM reaches only rank 0 (the process the user started); both ranks
    stop after the same step within seconds, one message, a complete checkpoint, no gloo errors."""
    out = str(tmp_path / "out")
    proc, cfg = _start({"output_dir": out, "slow": 0.3, "args": {"strategy": "ddp", "devices": 2, "save_steps": 100}},
                       tmp_path, "stopped")
    deadline = time.monotonic() + 300
    while not os.path.exists(cfg["started"]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert time.monotonic() - sent < 30  # a few seconds on an idle machine; generous for a loaded one
    (step,) = _complete(out)
    assert err.count("Received SIGTERM") == 1 and f"stopped after optimizer step {step}" in err
    for noise in ("Traceback", "ProcessGroupGloo", "Connection closed", "Connection reset", "exited with errors"):
        assert noise not in err, noise
