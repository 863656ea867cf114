"""Checkpoint IO plugins and their registry."""

from taskfit.io.checkpoint_io import CheckpointIO, TorchCheckpointIO, write_bytes_atomic
from taskfit.registry import Registry

CHECKPOINT_IO = Registry("checkpoint_io")
CHECKPOINT_IO.register("auto", TorchCheckpointIO, description="torch.save over fsspec, atomic")
CHECKPOINT_IO.register("torch", TorchCheckpointIO, description="torch.save over fsspec, atomic")

__all__ = ["CHECKPOINT_IO", "CheckpointIO", "TorchCheckpointIO", "write_bytes_atomic"]
