"""A disk that fills up during a run (F-CKPT-4, F-REL-4): with ``RLIMIT_FSIZE`` lowered after step 5, the save of
checkpoint-8 fails with an error naming the file, no partial file is left, checkpoint-4 stays the newest complete
one, and resuming from it (with space again) ends bitwise equal to the uninterrupted run. Synchronous and background
saves (the failure of a background save is raised at the next save or at the end)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from proc import RJOB, complete_checkpoints, finish, run, start, wait_group_gone

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
from job import assert_same_run  # noqa: E402

BASE = {"save_steps": 4, "args": {"max_steps": 10}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    return run(RJOB, {**BASE, "output_dir": str(tmp / "out"), "resume": None}, tmp, "ref")


@pytest.mark.parametrize("background", [False, True])
def test_F_REL_4_full_disk_fails_the_save_naming_the_file_and_resume_is_exact(background, tmp_path, reference):
    out = tmp_path / "out"
    proc, _ = start(RJOB, {**BASE, "output_dir": str(out), "resume": None, "async": background,
                           "file_size_limit": 200, "limit_after_step": 5}, tmp_path, "full")
    rc, err, _ = finish(proc, 120)
    assert wait_group_gone(proc.pid, 5) == []
    # a background save of checkpoint-4 may still be writing when the disk fills up: then that one fails
    failed = 4 if background and "checkpoint-4.tmp" in err else 8
    assert rc == 1 and "Could not write" in err and f"checkpoint-{failed}.tmp" in err and "File too large" in err, \
        err[-2000:]
    assert complete_checkpoints(out) == ([4] if failed == 8 else [])
    assert not list(out.rglob("*.tmp-*"))  # no partial temp file left behind
    got = run(RJOB, {**BASE, "output_dir": str(out), "async": background}, tmp_path, "resumed")
    assert_same_run(reference, got)
