"""Checkpoint IO: bytes only. Turns state dicts into files and back over ``fsspec`` (local paths or URLs).

Mirrors Lightning's ``CheckpointIO``/``TorchCheckpointIO``. Writes are atomic: bytes go to a temporary name in
the same folder and are renamed into place, so a crash never leaves a half-written file under the final name.
The full checkpoint layout (manifest, rotation, async saving, remote stores) is built on this interface.
"""

from __future__ import annotations

import io
import os
import uuid
from abc import ABC, abstractmethod
from typing import Any

import fsspec
import torch


class CheckpointIO(ABC):
    """Interface: save, load and remove one checkpoint object at a path or fsspec URL."""

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
        """Write ``checkpoint`` (a picklable dict of tensors and plain values) to ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: str, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        """Read what :meth:`save_checkpoint` wrote.

        Raises:
            FileNotFoundError: nothing at ``path``.
        """

    @abstractmethod
    def remove_checkpoint(self, path: str) -> None:
        """Delete ``path`` (a file or a folder, recursively); no error when it is absent."""

    def teardown(self) -> None:
        """Wait for and release background work (async subclasses)."""


def _fs(path: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, _, paths = fsspec.get_fs_token_paths(path, storage_options=storage_options or {})
    return fs, paths[0]


def write_bytes_atomic(path: str, data: bytes, storage_options: dict | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or all of it.

    Local files: temporary file + ``fsync`` + ``os.replace``. Other fsspec stores: a temporary object then
    ``fs.mv`` (object stores make a single PUT atomic already).
    """
    fs, p = _fs(path, storage_options)
    parent = p.rsplit("/", 1)[0] if "/" in p else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        return
    with fs.open(tmp, "wb") as f:
        f.write(data)
    fs.mv(tmp, p)


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` over fsspec with atomic writes (the default ``checkpoint_io="auto"``).

    Args:
        storage_options (dict | None): passed to ``fsspec`` for every path (credentials, endpoints).
    """

    def __init__(self, storage_options: dict | None = None) -> None:
        self.storage_options = storage_options or {}

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        write_bytes_atomic(path, buf.getvalue(), storage_options or self.storage_options)

    def load_checkpoint(self, path: str, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        fs, p = _fs(path, self.storage_options)
        if not fs.exists(p):
            raise FileNotFoundError(f"No checkpoint file at {path!r}.")
        with fs.open(p, "rb") as f:
            return torch.load(io.BytesIO(f.read()), map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: str) -> None:
        fs, p = _fs(path, self.storage_options)
        if fs.exists(p):
            fs.rm(p, recursive=True)

    def save_weights(self, state_dict: dict[str, torch.Tensor], path: str, safetensors: bool = True,
                     metadata: dict[str, str] | None = None) -> None:
        """Write model weights: ``safetensors`` (default, mirrors HF ``save_safetensors=True``) or ``torch.save``.

        Tensors that share storage (tied weights) are cloned for safetensors, which refuses shared storage.
        """
        if not safetensors:
            return self.save_checkpoint(state_dict, path)
        from safetensors.torch import save

        seen: set[int] = set()
        flat = {}
        for k, v in state_dict.items():
            v = v.detach().cpu()
            ptr = v.untyped_storage().data_ptr()
            flat[k] = v.clone().contiguous() if ptr in seen else v.contiguous()
            seen.add(ptr)
        write_bytes_atomic(path, save(flat, metadata=metadata or {"format": "pt"}), self.storage_options)

    def load_weights(self, path: str) -> dict[str, torch.Tensor]:
        """Read weights written by :meth:`save_weights` (format picked by the ``.safetensors`` suffix)."""
        fs, p = _fs(path, self.storage_options)
        if not p.endswith(".safetensors"):
            return self.load_checkpoint(path)
        from safetensors.torch import load

        with fs.open(p, "rb") as f:
            return load(f.read())
