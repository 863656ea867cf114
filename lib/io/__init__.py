"""Checkpoint IO plugins and their registry (``checkpoint_io="auto" | "torch" | "async"``); the checkpoint format
(layout, manifest, version, verification, rotation) is :mod:`taskfit.io.checkpoint_format`."""

from taskfit.io.async_checkpoint_io import AsyncCheckpointIO, CheckpointSaveError
from taskfit.io.checkpoint_io import (
    CheckpointError, CheckpointIO, TorchCheckpointIO, UnsafeCheckpointError, write_bytes_atomic,
)
from taskfit.registry import Registry

CHECKPOINT_IO = Registry("checkpoint_io")
CHECKPOINT_IO.register("auto", TorchCheckpointIO, description="torch.save over fsspec, atomic")
CHECKPOINT_IO.register("torch", TorchCheckpointIO, description="torch.save over fsspec, atomic")
CHECKPOINT_IO.register("async", AsyncCheckpointIO, description="torch.save over fsspec on a background thread")

__all__ = ["CHECKPOINT_IO", "AsyncCheckpointIO", "CheckpointError", "CheckpointIO", "CheckpointSaveError",
           "TorchCheckpointIO", "UnsafeCheckpointError", "write_bytes_atomic"]
