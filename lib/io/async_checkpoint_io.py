"""Background checkpoint saving (F-CKPT-4): ``AsyncCheckpointIO`` (mirrors Lightning's ``AsyncCheckpointIO``).

A save takes a snapshot of the state (every tensor copied to the CPU) on the calling thread, then serialises,
hashes and writes it on one background thread while training goes on. At most one save is in flight: the next
save, a load, a removal and :meth:`teardown` first wait for it, and a failed background save is raised there
(never swallowed). The files written are byte-for-byte those of the wrapped synchronous plugin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from taskfit.io.checkpoint_io import CheckpointIO, FileEntry, TorchCheckpointIO


_THREAD_PREFIX = "taskfit-checkpoint"


class CheckpointSaveError(RuntimeError):
    """A background checkpoint save failed; raised at the next save, load or at the end of training."""


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are fresh CPU copies and whose containers are new, so training may
    change the originals while the copy is being written."""
    return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))


class AsyncCheckpointIO(CheckpointIO):
    """Run the saves of ``checkpoint_io`` on a background thread (``checkpoint_io="async"``).

    Args:
        checkpoint_io (CheckpointIO | None): the plugin that does the writing (``TorchCheckpointIO`` when None).

    Attributes:
        last_blocking_seconds (float): time the last save blocked the caller (wait for the previous save +
            snapshot), in seconds.
        last_background_seconds (float): time the last finished background save took, in seconds.

    Raises:
        CheckpointSaveError: from :meth:`save_files`, :meth:`save_checkpoint`, :meth:`wait` or :meth:`teardown`
            when the previous background save failed.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self.last_blocking_seconds = 0.0
        self.last_background_seconds = 0.0

    @property
    def storage_options(self) -> dict:  # type: ignore[override]
        return self.checkpoint_io.storage_options

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        start = time.perf_counter()
        self.wait()
        args = snapshot(args)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_THREAD_PREFIX)

        def run() -> None:
            t0 = time.perf_counter()
            fn(*args)
            self.last_background_seconds = time.perf_counter() - t0

        self._future = self._executor.submit(run)
        self.last_blocking_seconds = time.perf_counter() - start

    def wait(self) -> None:
        if threading.current_thread().name.startswith(_THREAD_PREFIX):
            return  # called by the save running on the background thread itself: waiting would deadlock
        future, self._future = self._future, None
        if future is None:
            return
        try:
            future.result()
        except BaseException as exc:
            raise CheckpointSaveError(f"A background checkpoint save failed: {type(exc).__name__}: {exc}") from exc

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
        self._submit(self.checkpoint_io.save_checkpoint, checkpoint, path, storage_options)

    def save_files(self, files: Mapping[str, Any], folder: str,
                   finalize: Callable[[dict[str, FileEntry]], None] | None = None) -> None:
        self._submit(self.checkpoint_io.save_files, dict(files), folder, finalize)

    def load_checkpoint(self, path: str, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        self.wait()
        return self.checkpoint_io.load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: str) -> None:
        self.wait()
        self.checkpoint_io.remove_checkpoint(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.checkpoint_io.write_bytes(path, data)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
