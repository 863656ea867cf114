"""A checkpoint destination on an fsspec filesystem that fails part-way (F-CKPT-4, F-REL-4): a registered
in-memory filesystem (``flakyckpt://``, its own store) raises ``OSError`` on a chosen write of checkpoint-8 (a file
in the middle of the folder, or the manifest that makes it complete) or on a chosen read at resume. The run fails
with an error naming the path, checkpoint-8 never looks complete, checkpoint-4 stays the newest complete one, and
resuming from it (the filesystem healthy again) ends bitwise equal to the uninterrupted run. Runs in-process (one
process, a few seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402

from taskfit.checkpoint.writer import list_checkpoints  # noqa: E402
from taskfit.io import CheckpointError, TorchCheckpointIO  # noqa: E402

BASE = {"save_steps": 4, "args": {"max_steps": 10}}


class FlakyFS(MemoryFileSystem):
    """``memory://`` with its own store and injectable faults: ``fail_write`` / ``fail_read`` are path suffixes
    (e.g. ``"checkpoint-8/manifest.json"``); a matching write or read raises ``OSError``."""

    protocol = ("flakyckpt",)
    store: dict = {}
    pseudo_dirs = [""]
    fail_write: str | None = None
    fail_read: str | None = None

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        if self.fail_write and self._strip_protocol(path).endswith(self.fail_write):
            raise OSError(5, "Input/output error (injected)")
        return super().pipe_file(path, value, mode=mode, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        if self.fail_read and self._strip_protocol(path).endswith(self.fail_read):
            raise OSError(5, "Input/output error (injected)")
        return super().cat_file(path, start=start, end=end, **kwargs)




@pytest.fixture(autouse=True)
def _healthy_fs():
    # registered per test, under its own protocol: tests/publish registers a different "flaky" store
    fsspec.register_implementation("flakyckpt", FlakyFS, clobber=True)
    FlakyFS.store.clear()
    FlakyFS.pseudo_dirs[:] = [""]
    FlakyFS.fail_write = FlakyFS.fail_read = None
    yield
    FlakyFS.store.clear()
    FlakyFS.pseudo_dirs[:] = [""]
    FlakyFS.fail_write = FlakyFS.fail_read = None


def _run(out: str, resume) -> dict:
    return job.run({**BASE, "output_dir": out, "resume": resume})


def _complete(out: str) -> list[int]:
    return [step for step, _ in list_checkpoints(TorchCheckpointIO(), out)]


@pytest.mark.parametrize("fails", ["optimizer.pt", "manifest.json"])
def test_F_REL_4_failing_fsspec_write_keeps_the_previous_checkpoint_and_resume_is_exact(fails):
    reference = _run("flakyckpt://ref/out", None)
    out = "flakyckpt://run/out"
    FlakyFS.fail_write = f"checkpoint-8/{fails}"
    with pytest.raises(OSError) as err:
        _run(out, None)
    assert f"run/out/checkpoint-8/{fails}" in str(err.value) and "injected" in str(err.value)
    fs = fsspec.filesystem("flakyckpt")
    assert not fs.exists("run/out/checkpoint-8/manifest.json")  # nothing that looks complete
    assert _complete(out) == [4]
    FlakyFS.fail_write = None
    job.assert_same_run(reference, _run(out, True))  # from checkpoint-4 (the broken checkpoint-8 is rewritten)
    assert 8 in _complete(out)


def test_F_REL_4_failing_fsspec_read_on_resume_names_the_file():
    out = "flakyckpt://run/out"
    _run(out, None)
    newest = _complete(out)[-1]
    FlakyFS.fail_read = f"checkpoint-{newest}/optimizer.pt"
    with pytest.raises(CheckpointError, match=rf"run/out/checkpoint-{newest}/optimizer\.pt.*injected"):
        job.run({**BASE, "args": {"max_steps": 12}, "output_dir": out, "resume": True})
