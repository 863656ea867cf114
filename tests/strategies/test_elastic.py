"""Elastic restarts (F-CKPT-2, F-STRAT-7): ``resume_from_checkpoint="auto"`` and the default under an elastic
launcher's restart (``torchrun --max-restarts``, SLURM requeue) continue from the newest complete checkpoint; a
``torchrun --nproc-per-node=2 --max-restarts=1`` run whose worker is SIGKILLed mid-run finishes with the weights of
the run that never stopped."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers.models import Regression
from taskfit import Callback, Fit
from taskfit.io import TorchCheckpointIO
from taskfit.checkpoint.resume import resolve_checkpoint
from taskfit.strategies.environments import elastic_restart, find_free_port

_RESTART_VARS = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "SLURM_RESTART_COUNT")


@pytest.fixture
def no_launcher(monkeypatch):
    for k in _RESTART_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def _checkpoints(out: Path, complete=(2, 4), partial=(8,), tmp=(6,)) -> None:
    for n in complete:
        (out / f"checkpoint-{n}").mkdir(parents=True)
        (out / f"checkpoint-{n}" / "manifest.json").write_text("{}")
    for n in partial:  # files but no manifest (an object-store save cut short)
        (out / f"checkpoint-{n}").mkdir(parents=True)
        (out / f"checkpoint-{n}" / "model.safetensors").write_bytes(b"partial")
    for n in tmp:  # an interrupted local save
        (out / f"checkpoint-{n}.tmp").mkdir(parents=True)


def test_F_CKPT_2_auto_resolution(tmp_path, no_launcher, caplog):
    io, out = TorchCheckpointIO(), tmp_path / "out"
    # nothing there: a fresh start, for "auto" and for the elastic default alike
    assert resolve_checkpoint(io, str(out), "auto") is None
    no_launcher.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resolve_checkpoint(io, str(out), None) is None
    no_launcher.delenv("TORCHELASTIC_RESTART_COUNT")
    _checkpoints(out)
    with caplog.at_level(logging.INFO, logger="taskfit"):
        # the newest complete one; the .tmp folder and the manifest-less checkpoint-8 are ignored
        assert resolve_checkpoint(io, str(out), "auto") == str(out / "checkpoint-4")
    assert "Ignoring incomplete checkpoints" in caplog.text and "checkpoint-8" in caplog.text
    # no launcher restart: nothing given means a fresh start; False always does
    assert elastic_restart() is None and resolve_checkpoint(io, str(out), None) is None
    no_launcher.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun's first attempt
    assert resolve_checkpoint(io, str(out), None) is None
    caplog.clear()
    for var, count in (("TORCHELASTIC_RESTART_COUNT", "1"), ("SLURM_RESTART_COUNT", "2")):
        for k in _RESTART_VARS:
            no_launcher.delenv(k, raising=False)
        no_launcher.setenv(var, count)
        no_launcher.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
        with caplog.at_level(logging.WARNING, logger="taskfit"):
            assert resolve_checkpoint(io, str(out), None) == str(out / "checkpoint-4")
        assert resolve_checkpoint(io, str(out), False) is None
    assert "Elastic restart detected (torchrun restart 1 of at most 3)" in caplog.text
    assert "Elastic restart detected (slurm restart 2)" in caplog.text
    assert f"continues from {out / 'checkpoint-4'}" in caplog.text


def test_F_CKPT_2_slurm_requeue_continues_a_fit_by_default(tmp_path, no_launcher):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))
    starts = []

    class Start(Callback):
        def on_train_begin(self, args, state, control, **kw):
            starts.append(state.global_step)

    def fit(steps: int, out: str) -> Fit:
        torch.manual_seed(0)
        f = Fit(output_dir=str(tmp_path / out), max_steps=steps, save_steps=2, lr_scheduler_type="constant",
                per_device_train_batch_size=4, report_to="none", disable_tqdm=True, callbacks=[Start()])
        f.fit(Regression(features=3, seed=None), data)  # initialised from the seed set above
        return f

    whole = fit(6, "whole")
    fit(4, "run")  # the first attempt, ended after its checkpoint at step 4
    no_launcher.setenv("SLURM_RESTART_COUNT", "1")
    again = fit(6, "run")  # the requeued job: same script, nothing passed, continues from checkpoint-4
    assert starts == [0, 0, 4]
    for a, b in zip(whole.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)


JOB = textwrap.dedent('''
    """One worker of the elastic test: DDP on gloo, checkpoints every 2 steps; with KILL_AT set, rank 1 SIGKILLs
    itself after that optimizer step on torchrun's first attempt only."""
    import json, os, signal, sys
    import torch
    from taskfit import Callback, Fit, TaskModule

    out, result = sys.argv[1], sys.argv[2]
    kill_at = int(os.environ.get("KILL_AT", "0"))

    class Net(TaskModule):  # a standalone torchrun worker script: it imports nothing from tests/
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

    class Record(Callback):
        def on_train_begin(self, args, state, control, **kw):
            with open(result + ".starts", "a") as f:
                f.write(f"{os.environ['TORCHELASTIC_RESTART_COUNT']} {os.environ['RANK']} {state.global_step}\\n")

        def on_step_end(self, args, state, control, **kw):
            if (state.global_step == kill_at and os.environ["RANK"] == "1"
                    and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
                os.kill(os.getpid(), signal.SIGKILL)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 2, (40,), generator=g))
    torch.manual_seed(0)
    fit = Fit(output_dir=out, strategy="ddp", accelerator="cpu", max_steps=12, save_steps=2, learning_rate=0.05,
              per_device_train_batch_size=4, report_to="none", disable_tqdm=True, seed=1, callbacks=[Record()])
    fit.fit(Net(), data)
    if fit.is_global_zero:
        torch.save({k: v.detach().clone() for k, v in fit.model.state_dict().items()}, result)
''')


def _torchrun(tmp_path: Path, name: str, kill_at: int) -> subprocess.CompletedProcess:
    job = tmp_path / "elastic_job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in _RESTART_VARS}
    env.update(KILL_AT=str(kill_at), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{find_free_port()}", str(job),
           str(tmp_path / name), str(tmp_path / f"{name}.pt")]
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.distributed
def test_F_STRAT_7_torchrun_restart_after_sigkill_equals_uninterrupted_run(tmp_path):
    whole = _torchrun(tmp_path, "whole", kill_at=0)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # 40 samples over 2 ranks at 4 per device: 5 steps per epoch; step 7 is mid-epoch, after checkpoint-6
    killed = _torchrun(tmp_path, "killed", kill_at=7)
    assert killed.returncode == 0, killed.stderr[-3000:]
    starts = sorted((tmp_path / "killed.pt.starts").read_text().split("\n")[:-1])
    assert starts == ["0 0 0", "0 1 0", "1 0 6", "1 1 6"], starts  # the restart continued from checkpoint-6
    assert "Elastic restart detected (torchrun restart 1 of at most 1)" in killed.stderr
    a, b = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "killed.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bitwise: fp32 on CPU with gloo
