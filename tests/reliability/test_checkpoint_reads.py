"""Checkpoint IO reads (issue: hashes are computed while writing, resume reads each file once; F-CKPT-4, F-REL-4):
every ``open`` of a checkpoint file is recorded (``builtins.open`` and ``io.open``, which fsspec's local file
system, pathlib and torch.distributed.checkpoint go through) with its mode and thread.

- Saving never reads a file back on the training thread: taskfit's own files are hashed from the bytes being
  written, and the shards written by torch.distributed.checkpoint (FSDP) are hashed once on a background thread.
- Resuming reads every file of the checkpoint exactly once (manifest included), shards too: the bytes read are
  verified and loaded; the files a resume does not load (HF's copies) are verified too.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

from taskfit import Fit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


class OpenRecorder:
    """Records ``(relative path, mode, thread name)`` of every open under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root, self.opens = str(root), []
        self._orig_builtin, self._orig_io = builtins.open, io.open

    def _wrap(self, orig):
        def opener(file, mode="r", *args, **kwargs):
            path = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
            if path is not None and os.path.abspath(path).startswith(self.root):
                rel = os.path.relpath(os.path.abspath(path), self.root)
                self.opens.append((rel, mode if isinstance(mode, str) else "r", threading.current_thread().name))
            return orig(file, mode, *args, **kwargs)
        return opener

    def __enter__(self) -> OpenRecorder:
        builtins.open = self._wrap(self._orig_builtin)
        io.open = self._wrap(self._orig_io)
        return self

    def __exit__(self, *exc) -> None:
        builtins.open, io.open = self._orig_builtin, self._orig_io

    def reads(self, thread: str | None = None) -> Counter:
        return Counter(rel for rel, mode, t in self.opens
                       if "r" in mode and "+" not in mode and (thread is None or t == thread))


def _fit(out: Path, **kw) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, **kw)


@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_F_CKPT_4_save_hashes_while_writing_and_resume_reads_each_file_once(strategy, tmp_path):
    out = tmp_path / "out"
    torch.manual_seed(0)
    with OpenRecorder(out) as saving:
        _fit(out, max_steps=4, save_steps=4, strategy=strategy, devices=1).fit(job.Net(), job.data())
    ck = out / "checkpoint-4"
    manifest = json.loads((ck / "manifest.json").read_text())
    shards = [n for n in manifest["files"] if n.startswith("shards/")]
    assert (strategy == "fsdp") == bool(shards)
    # nothing read back on the training thread; each backend-written shard hashed exactly once, in the background
    assert saving.reads("MainThread") == Counter()
    background = saving.reads()
    assert {n: background[os.path.join("checkpoint-4.tmp", n)] for n in shards} == {n: 1 for n in shards}
    assert sum(background.values()) == len(shards)
    for name, entry in manifest["files"].items():  # and the recorded hashes are those of the files on disk
        data = (ck / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name

    torch.manual_seed(0)
    with OpenRecorder(out) as resuming:
        fit = _fit(out, max_steps=6, save_steps=100, save_strategy="no", strategy=strategy, devices=1)
        fit.fit(job.Net(), job.data(), resume_from_checkpoint=True)
    assert fit.state.global_step == 6
    reads = {rel: n for rel, n in resuming.reads().items() if rel.startswith("checkpoint-4")}
    # every listed file once, the copies for HF (trainer_state.json, config.json, rng_state.pth) too: verified
    expected = {os.path.join("checkpoint-4", n): 1 for n in [*manifest["files"], "manifest.json"]}
    assert reads == expected
