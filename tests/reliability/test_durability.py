"""Durable saves on the local disk (F-REL-4): before a checkpoint becomes complete, every file's data and the
folder's entries reach the disk; the manifest is synced before the folder is renamed into place, and the parent
folder is synced after the rename. Recorded by wrapping ``os.fsync`` / ``os.replace`` / ``os.rename`` during
real saves (synchronous, background, and with torch.distributed.checkpoint shards)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from taskfit import Fit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


@pytest.fixture
def events(monkeypatch):
    log: list[tuple] = []
    fsync, replace, rename = os.fsync, os.replace, os.rename

    def rec_fsync(fd):
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def rec_replace(src, dst, *a, **kw):
        out = replace(src, dst, *a, **kw)
        log.append(("replace", os.path.abspath(src), os.path.abspath(dst)))
        return out

    def rec_rename(src, dst, *a, **kw):
        out = rename(src, dst, *a, **kw)
        log.append(("replace", os.path.abspath(src), os.path.abspath(dst)))
        return out

    monkeypatch.setattr(os, "fsync", rec_fsync)
    monkeypatch.setattr(os, "replace", rec_replace)
    monkeypatch.setattr(os, "rename", rec_rename)
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name synced files")
    return log


def _index(log, pred) -> int:
    return next(i for i, e in enumerate(log) if pred(e))


@pytest.mark.parametrize("kind", ["sync", "async", "fsdp"])
def test_F_REL_4_files_and_folders_are_synced_before_the_checkpoint_completes(kind, tmp_path, events):
    out = (tmp_path / "out").resolve()
    kw = {"checkpoint_io": "async"} if kind == "async" else {"strategy": "fsdp", "devices": 1} if kind == "fsdp" else {}
    torch.manual_seed(0)
    Fit(output_dir=str(out), max_steps=2, save_steps=2, per_device_train_batch_size=4, report_to="none",
        disable_tqdm=True, **kw).fit(job.Net(), job.data())
    final, tmp = str(out / "checkpoint-2"), str(out / "checkpoint-2.tmp")
    names = json.loads((out / "checkpoint-2" / "manifest.json").read_text())["files"]
    made_complete = _index(events, lambda e: e[0] == "replace" and e[2] == os.path.join(tmp, "manifest.json"))
    renamed = _index(events, lambda e: e[0] == "replace" and e[1] == tmp and e[2] == final)
    synced = {e[1] for e in events[:made_complete] if e[0] == "fsync"}
    placed = {e[1]: e[2] for e in events[:made_complete] if e[0] == "replace"}  # temp file -> its name
    for name in names:
        path = os.path.join(tmp, name)
        assert path in synced or any(dst == path and src in synced for src, dst in placed.items()), name
    folders = {os.path.dirname(os.path.join(tmp, n)) for n in names}
    last_file = max(i for i, e in enumerate(events[:made_complete]) if e[0] == "replace")
    assert folders <= {e[1] for e in events[last_file:made_complete] if e[0] == "fsync"}
    manifest_synced = [i for i, e in enumerate(events) if e[0] == "fsync" and e[1].startswith(
        os.path.join(tmp, "manifest.json"))]
    assert manifest_synced and manifest_synced[0] < made_complete < renamed
    assert ("fsync", tmp) in events[made_complete:renamed]  # the manifest's entry, before the rename
    assert ("fsync", str(out)) in events[renamed:]  # the rename itself
