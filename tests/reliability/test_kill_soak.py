"""Seeded SIGKILL soak (F-CKPT-2, F-REL-2): runs are killed at random points (after a step, right after a save,
in the middle of a background save; one or two kills per trial), resumed with ``resume_from_checkpoint=True`` until
they finish, and must end bitwise equal to the uninterrupted run: weights, optimizer state, logged metrics and
training loss. A handful of single-process trials run by default; the ``slow`` marker runs 30 single-process and
10 DDP (2 processes) trials (``make test-reliability``). The seed is fixed, so a failure names a reproducible
trial; ``TASKFIT_SOAK_SEED`` picks another schedule."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from proc import RJOB, complete_checkpoints, finish, run, start, wait_group_gone

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
from job import assert_same_run  # noqa: E402

SEED = int(os.environ.get("TASKFIT_SOAK_SEED", "2026"))
# 50 samples, batch 4, accumulation 2 -> 7 optimizer steps per epoch, 3 epochs = 21 steps; saves every 3 steps,
# evaluation every 5, logging every 2
CFG = {"save_steps": 3}
STEPS = 21
DDP = {"save_steps": 3, "args": {"strategy": "ddp", "devices": 2, "ddp_timeout": 30}}
DDP_STEPS = 12  # 2 ranks: 25 samples each -> 7 micro-batches, 4 optimizer steps per epoch


def schedule(seed: int, trials: int, steps: int) -> list[list[dict]]:
    """``trials`` lists of 1-2 kills, each ``{"kind": ..., "step": ...}`` with increasing steps."""
    rng = random.Random(seed)
    out = []
    for _ in range(trials):
        kills, last = [], 0
        for _ in range(rng.choice([1, 1, 2])):
            if last >= steps - 1:
                break
            step = rng.randint(last + 1, steps - 1)
            kind = rng.choice(["after_step", "after_step", "after_save", "during_async_save"])
            if kind == "after_save":
                step = max(3, step - step % 3)  # a save step
                if step <= last:
                    continue
            kills.append({"kind": kind, "step": step})
            last = step
        out.append(kills)
    return out


def _kill_cfg(kill: dict) -> dict:
    if kill["kind"] == "after_save":
        return {"kill_after_save": kill["step"]}
    if kill["kind"] == "during_async_save":  # the step after a save, while the slow background write goes on
        return {"kill_after_step": kill["step"], "async": True, "slow_io": 0.2}
    return {"kill_after_step": kill["step"]}


def _trial(tmp: Path, base: dict, kills: list[dict], reference: dict, timeout: float) -> None:
    out = str(tmp / "out")
    for i, kill in enumerate(kills):
        proc, _ = start(RJOB, {**base, **_kill_cfg(kill), "output_dir": out}, tmp, f"killed{i}")
        rc, err, _ = finish(proc, timeout)
        assert rc != 0, f"kill {kill} did not happen:\n{err[-2000:]}"
        assert wait_group_gone(proc.pid, 40) == []  # every rank gone (the survivors within ddp_timeout)
        assert all(s < kill["step"] or kill["kind"] == "after_save" for s in complete_checkpoints(out))
    got = run(RJOB, {**base, "output_dir": out}, tmp, "resumed", timeout=timeout)
    assert_same_run(reference, got)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    return run(RJOB, {**CFG, "output_dir": str(tmp / "out"), "resume": None}, tmp, "ref")


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_F_CKPT_2_seeded_kill_soak_quick(trial, tmp_path, reference):
    kills = schedule(SEED, 3, STEPS)[trial]
    _trial(tmp_path, CFG, kills, reference, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(30))
def test_F_CKPT_2_seeded_kill_soak_single_process(trial, tmp_path, reference):
    kills = schedule(SEED + 1, 30, STEPS)[trial]
    _trial(tmp_path, CFG, kills, reference, timeout=120)


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddpref")
    return run(RJOB, {**DDP, "output_dir": str(tmp / "out"), "resume": None}, tmp, "ref", timeout=300)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("trial", range(10))
def test_F_CKPT_2_seeded_kill_soak_ddp(trial, tmp_path, ddp_reference):
    kills = schedule(SEED + 2, 10, DDP_STEPS)[trial]
    _trial(tmp_path, DDP, kills, ddp_reference, timeout=300)
