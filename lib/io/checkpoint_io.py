"""Checkpoint IO: bytes only. Turns state dicts into files and back over ``fsspec`` (local paths or any URL:
``file://``, ``memory://``, ``s3://`` ...).

Mirrors Lightning's ``CheckpointIO``/``TorchCheckpointIO`` and adds folder-level writes for checkpoint folders:
:meth:`CheckpointIO.save_files` serialises a ``{file name: object}`` mapping (the format is chosen by the file
suffix), writes each file atomically and hands the sizes and SHA-256 checksums to a ``finalize`` callback that
the caller uses to write the folder's manifest last. Loading is safe by default (``torch.load(weights_only=True)``
and safetensors); a file that needs full unpickling is refused with :class:`UnsafeCheckpointError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import torch

#: ``{"size": bytes, "sha256": hex digest}`` of one written file
FileEntry = dict[str, Any]


class CheckpointError(ValueError):
    """A checkpoint cannot be used: missing, incomplete, corrupted (checksum mismatch), unsafe or incompatible.
    The message names the file."""


class UnsafeCheckpointError(pickle.UnpicklingError, CheckpointError):
    """A checkpoint file holds pickled objects that ``torch.load(weights_only=True)`` refuses (they could run code
    when loaded). Load it with ``weights_only=False`` only if you trust where it came from."""


def filesystem(path: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(filesystem, path inside it)`` for a local path or fsspec URL."""
    fs, _, paths = fsspec.get_fs_token_paths(path, storage_options=storage_options or {})
    return fs, paths[0]


def is_local_fs(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local disk (where a folder rename is atomic); False for object stores and ``memory://``."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def join(folder: str, *names: str) -> str:
    """``folder/name`` for local paths and URLs alike (URLs always use ``/``)."""
    return "/".join([folder.rstrip("/"), *names]) if "://" in folder else os.path.join(folder, *names)


def write_bytes_atomic(path: str, data: bytes, storage_options: dict | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or all of it.

    Local files: temporary file + ``fsync`` + ``os.replace``. Other fsspec stores: one ``PUT`` of the whole object,
    which object stores make visible atomically (a rename there would be a copy, not atomic).
    """
    fs, p = filesystem(path, storage_options)
    if is_local_fs(fs):
        os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
        tmp = f"{p}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except OSError as exc:  # a full disk or a file-size limit: name the file, leave no partial temp file
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OSError(exc.errno, f"Could not write {len(data)} bytes to {p!r}: {exc.strerror or exc}") from exc
        return
    parent = p.rsplit("/", 1)[0] if "/" in p else ""
    try:
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(p, data)
    except OSError as exc:  # a failing store: name the object (the caller's manifest is not written after it)
        raise OSError(exc.errno, f"Could not write {len(data)} bytes to {path!r}: {exc.strerror or exc}") from exc


def safetensors_bytes(state_dict: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """Serialise weights with safetensors (``{"format": "pt"}`` metadata, as HF ``save_pretrained`` writes).

    Tensors that share storage (tied weights) are cloned: safetensors refuses shared storage.
    """
    from safetensors.torch import save

    seen: set[int] = set()
    flat = {}
    for k, v in state_dict.items():
        v = v.detach().cpu()
        ptr = v.untyped_storage().data_ptr()
        flat[k] = v.clone().contiguous() if ptr in seen else v.contiguous()
        seen.add(ptr)
    return save(flat, metadata=metadata or {"format": "pt"})


def serialize(name: str, obj: Any) -> bytes:
    """Bytes of ``obj`` for a file called ``name``: ``bytes`` as given; ``str`` as UTF-8; ``*.json`` dicts as JSON;
    ``*.safetensors`` state dicts with safetensors; anything else with ``torch.save``."""
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if name.endswith(".json"):
        return json.dumps(obj, indent=2, sort_keys=True, default=str).encode("utf-8")
    if name.endswith(".safetensors"):
        return safetensors_bytes(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def deserialize(name: str, data: bytes, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """Inverse of :func:`serialize` (``*.json`` -> object, ``*.safetensors`` -> state dict, ``*.txt``/``*.md`` ->
    str, else ``torch.load``).

    Raises:
        UnsafeCheckpointError: ``weights_only=True`` and the file holds objects that need full unpickling.
    """
    if name.endswith(".json"):
        return json.loads(data.decode("utf-8"))
    if name.endswith((".txt", ".md")):
        return data.decode("utf-8")
    if name.endswith(".safetensors"):
        from safetensors.torch import load

        return load(data)
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only or "weights only" not in str(exc).lower():
            raise  # not a refused global: garbage bytes (callers name the file)
        raise UnsafeCheckpointError(
            f"Refusing to load {name!r}: it contains pickled objects that torch.load(weights_only=True) does not "
            "allow, and unpickling them could run arbitrary code. If you trust this checkpoint, load it with "
            f"weights_only=False (Fit.fit(..., weights_only=False)). torch said: {str(exc).splitlines()[0]}") from exc


def file_entry(data: bytes) -> FileEntry:
    """Size (bytes) and SHA-256 of ``data``, as recorded in a checkpoint manifest."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class CheckpointIO(ABC):
    """Save, load and remove checkpoint files at a path or fsspec URL (base class; mirrors Lightning's).

    Subclasses implement :meth:`save_checkpoint`, :meth:`load_checkpoint` and :meth:`remove_checkpoint`; the
    folder-level and file-system helpers work for all of them.

    Args:
        storage_options (dict | None): passed to ``fsspec`` for every path (credentials, endpoints, ...).
    """

    def __init__(self, storage_options: dict | None = None) -> None:
        self.storage_options = storage_options or {}

    # ---- the Lightning interface -------------------------------------------------------------------------
    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
        """Write ``checkpoint`` (a picklable dict of tensors and plain values) to ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: str, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        """Read what :meth:`save_checkpoint` wrote.

        Raises:
            FileNotFoundError: nothing at ``path``.
            UnsafeCheckpointError: the file needs full unpickling and ``weights_only`` is True.
        """

    @abstractmethod
    def remove_checkpoint(self, path: str) -> None:
        """Delete ``path`` (a file or a folder, recursively); no error when it is absent."""

    def teardown(self) -> None:
        """Wait for and release background work (async subclasses); re-raise a failed background save."""

    def wait(self) -> None:
        """Block until no save is in flight (a no-op for synchronous IO)."""

    def save_weights(self, state_dict: dict[str, torch.Tensor], path: str, safetensors: bool = True,
                     metadata: dict[str, str] | None = None) -> None:
        """Write model weights: ``safetensors`` (default, mirrors HF ``save_safetensors=True``) or ``torch.save``.

        Tensors that share storage (tied weights) are cloned for safetensors, which refuses shared storage.
        """
        if not safetensors:
            return self.save_checkpoint(state_dict, path)
        self.write_bytes(path, safetensors_bytes(state_dict, metadata))

    def load_weights(self, path: str) -> dict[str, torch.Tensor]:
        """Read weights written by :meth:`save_weights` (format picked by the ``.safetensors`` suffix)."""
        return deserialize(path if path.endswith(".safetensors") else "weights.pt", self.read_bytes(path))

    # ---- folders ------------------------------------------------------------------------------------------
    def save_files(self, files: Mapping[str, Any], folder: str,
                   finalize: Callable[[dict[str, FileEntry]], None] | None = None) -> None:
        """Write every ``{name: object}`` of ``files`` into ``folder`` (see :func:`serialize` for formats), each
        file atomically, then call ``finalize({name: {"size", "sha256"}})`` (which writes the manifest)."""
        entries = {}
        for name, obj in files.items():
            data = serialize(name, obj)
            self.write_bytes(join(folder, name), data)
            entries[name] = file_entry(data)
        if finalize is not None:
            finalize(entries)

    # ---- file system helpers ------------------------------------------------------------------------------
    def fs(self, path: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """``(filesystem, inner path)`` for ``path`` with this plugin's storage options."""
        return filesystem(path, self.storage_options)

    def is_local(self, path: str) -> bool:
        """True when ``path`` is on the local disk."""
        return is_local_fs(self.fs(path)[0])

    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomic write (see :func:`write_bytes_atomic`)."""
        write_bytes_atomic(path, data, self.storage_options)

    def read_bytes(self, path: str) -> bytes:
        """Whole file at ``path``.

        Raises:
            FileNotFoundError: nothing at ``path``.
            OSError: the read failed (the message names ``path``).
        """
        fs, p = self.fs(path)
        try:
            return fs.cat_file(p)
        except FileNotFoundError:
            raise FileNotFoundError(f"No checkpoint file at {path!r}.") from None
        except OSError as exc:  # a failing disk or store: name the file
            raise OSError(exc.errno, f"Could not read {path!r}: {exc.strerror or exc}") from exc

    def exists(self, path: str) -> bool:
        fs, p = self.fs(path)
        fs.invalidate_cache()  # object-store listings are cached per instance; another process may have written
        return fs.exists(p)

    def listdir(self, path: str) -> list[str]:
        """Names (not paths) directly inside folder ``path``; empty when it does not exist."""
        fs, p = self.fs(path)
        fs.invalidate_cache()
        try:
            return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False))
        except FileNotFoundError:
            return []

    def rename(self, src: str, dst: str) -> None:
        """Rename folder ``src`` to ``dst`` (replacing ``dst``); atomic on the local disk."""
        fs, s = self.fs(src)
        _, d = self.fs(dst)
        if is_local_fs(fs):
            if os.path.islink(d):  # replace the link itself, never what it points to
                os.unlink(d)
            elif os.path.exists(d):
                import shutil

                shutil.rmtree(d)
            os.replace(s, d)
        else:
            fs.mv(s, d, recursive=True)


class TorchCheckpointIO(CheckpointIO):
    """``torch.save``/``torch.load`` over fsspec with atomic writes (the default ``checkpoint_io="auto"``).

    Args:
        storage_options (dict | None): passed to ``fsspec`` for every path (credentials, endpoints).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: dict | None = None) -> None:
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        write_bytes_atomic(path, buf.getvalue(), storage_options or self.storage_options)

    def load_checkpoint(self, path: str, map_location: Any = "cpu", weights_only: bool = True) -> dict[str, Any]:
        return deserialize("checkpoint.pt", self.read_bytes(path), map_location, weights_only)

    def remove_checkpoint(self, path: str) -> None:
        fs, p = self.fs(path)
        fs.invalidate_cache()
        if is_local_fs(fs) and os.path.islink(p):  # remove the link, never what it points to
            os.unlink(p)
        elif fs.exists(p):
            fs.rm(p, recursive=True)
