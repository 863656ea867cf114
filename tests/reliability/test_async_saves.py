"""Background (async) checkpoint saves never deadlock and survive kills (F-REL-2, F-CKPT-4): ``save_total_limit``
rotation from the background thread, DDP part files removed by rank 0, FSDP and DeepSpeed shards; a SIGKILL while
a background save is writing leaves nothing that resume would pick, and the resumed run equals the uninterrupted one.
Every job runs in its own process group with a hard timeout (a hang fails the test, nothing is left running)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from proc import RJOB, complete_checkpoints, finish, run, start, wait_group_gone

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
from job import assert_same_run  # noqa: E402

BASE = {"save_steps": 4, "args": {"max_steps": 12, "save_total_limit": 2}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    return run(RJOB, {**BASE, "output_dir": str(tmp / "out"), "resume": None}, tmp, "ref")


def test_F_REL_2_async_with_save_total_limit_rotates_without_deadlock(tmp_path, reference):
    out = tmp_path / "out"
    got = run(RJOB, {**BASE, "async": True, "output_dir": str(out), "resume": None}, tmp_path, "async", timeout=120)
    assert complete_checkpoints(out) == [8, 12]  # rotated down to the limit from the background thread
    assert not list(out.glob("*.tmp"))
    assert_same_run(reference, got)


@pytest.mark.distributed
def test_F_REL_2_async_under_ddp_finishes_and_writes_complete_checkpoints(tmp_path):
    out = tmp_path / "out"
    cfg = {**BASE, "async": True, "output_dir": str(out), "resume": None,
           "args": {**BASE["args"], "strategy": "ddp", "devices": 2, "ddp_timeout": 30}}
    run(RJOB, cfg, tmp_path, "ddp_async", timeout=180)
    assert complete_checkpoints(out) == [8, 12] and not list(out.glob("*.tmp"))
    manifest = json.loads((out / "checkpoint-12" / "manifest.json").read_text())
    assert {"rng_state_0.pt", "rng_state_1.pt"} <= set(manifest["files"])
    assert not list((out / "checkpoint-12").glob(".part-*"))


def test_F_REL_2_kill_during_a_background_save_resumes_exactly(tmp_path, reference):
    """SIGKILL at step 5 while the background thread is still writing checkpoint-4 (every file write takes
    0.3 s): checkpoint-4 is incomplete, resume starts from scratch and still ends equal."""
    out = tmp_path / "out"
    run(RJOB, {**BASE, "async": True, "slow_io": 0.3, "kill_after_step": 5, "output_dir": str(out)}, tmp_path,
        "killed", expect_kill=True, timeout=120)
    assert complete_checkpoints(out) == []
    got = run(RJOB, {**BASE, "async": True, "output_dir": str(out)}, tmp_path, "resumed", timeout=120)
    assert_same_run(reference, got)


def test_F_REL_2_kill_after_background_saves_resumes_from_the_newest_complete_one(tmp_path, reference):
    out = tmp_path / "out"
    run(RJOB, {**BASE, "async": True, "kill_after_step": 11, "output_dir": str(out)}, tmp_path, "killed",
        expect_kill=True, timeout=120)
    assert complete_checkpoints(out)[-1] in (4, 8)  # checkpoint-8 may still have been in flight
    got = run(RJOB, {**BASE, "async": True, "output_dir": str(out)}, tmp_path, "resumed", timeout=120)
    assert_same_run(reference, got)


@pytest.mark.slow  # default run: the single-process kill above; DDP kills mid-save also run in the slow soak
@pytest.mark.distributed
def test_F_REL_2_ddp_kill_during_a_background_save_resumes_exactly(tmp_path):
    ddp = {**BASE, "args": {**BASE["args"], "strategy": "ddp", "devices": 2, "ddp_timeout": 30}}
    ref = run(RJOB, {**ddp, "output_dir": str(tmp_path / "ref"), "resume": None}, tmp_path, "ref", timeout=180)
    out = tmp_path / "out"
    proc_cfg = {**ddp, "async": True, "slow_io": 0.3, "kill_after_step": 9, "output_dir": str(out)}
    proc, _ = start(RJOB, proc_cfg, tmp_path, "killed")
    rc, err, _ = finish(proc, 180)
    assert rc != 0
    assert wait_group_gone(proc.pid, 40) == []  # the other rank exits on its own, bounded by ddp_timeout
    assert complete_checkpoints(out) == [4]  # checkpoint-8 was still being written
    got = run(RJOB, {**ddp, "async": True, "output_dir": str(out)}, tmp_path, "resumed", timeout=180)
    assert_same_run(ref, got)
