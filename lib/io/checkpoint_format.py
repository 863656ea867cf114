"""The taskfit checkpoint format: layout, manifest, verification, listing and rotation (F-CKPT-1, F-CKPT-4).

Layout of ``output_dir/checkpoint-{global_step}/`` (``output_dir`` may be a local path or any fsspec URL)::

    model.safetensors       model weights (pytorch_model.bin with save_safetensors=False); for HF-style models
    config.json             the model's config (HF models: their own config.json, so from_pretrained reads it)
    optimizer.pt            optimizer state dict               (not with save_only_model, not when sharded)
    scheduler.pt            LR scheduler state dict            (not with save_only_model; absent without one)
    training_state.pt       precision plugin (grad scaler), loop state, control flags, callback states and the
                            loop's running loss sums            (not with save_only_model)
    rng_state_{rank}.pt     python / numpy / torch / accelerator RNG states, one file per rank
    rng_state.pth           one process only: the same RNG states in transformers' format, so that
                            ``transformers.Trainer`` resumes from the folder (see :mod:`taskfit.io.hf_checkpoint`)
    trainer_state.json      the loop state as readable JSON (HF's trainer_state.json)
    fit_args.json           the FitArguments of the run (credentials redacted)
    shards/...              sharded strategies only: torch.distributed.checkpoint files (FSDP) or the DeepSpeed
                            engine's files plus shards/taskfit_deepspeed.json
    manifest.json           written LAST: format, version, global_step, world_size, save_only_model and every
                            file with its size (bytes) and SHA-256

``manifest.json`` schema (version :data:`FORMAT_VERSION`)::

    {"format": "taskfit-checkpoint", "version": 1, "global_step": int, "world_size": int,
     "save_only_model": bool, "taskfit_version": str, "torch_version": str,
     "files": {"relative/name": {"size": int, "sha256": "64 hex digits"}, ...}}

plus ``"data_parallel_size": int`` under tensor parallelism (processes reading different data; absent: the world
size).

A checkpoint is complete exactly when its ``manifest.json`` exists. On the local disk the folder is assembled as
``checkpoint-N.tmp``; every file and the folder are ``fsync``-ed, the manifest is written (and synced) last and the
folder is renamed into place (then the parent folder is synced); on object stores (no atomic rename) the files
are written in place and the manifest last. With several processes every rank writes its own files plus a
``.part-{rank}.json`` list; the writing rank waits for all parts (at most ``ddp_timeout``) before the manifest.

Hashes are taken from the bytes as they are written: files serialised by taskfit are hashed in memory before
the write; files written by a strategy's backend (torch.distributed.checkpoint, DeepSpeed) are hashed (and
synced) on a background thread while the rest of the checkpoint is written. On load every file is read once:
the same bytes are verified against the manifest and then deserialised (:class:`CheckpointReader`); the
listed files a resume does not load are verified after it (:meth:`CheckpointReader.verify`).

Trust: a manifest is validated before use (schema, names that stay inside the folder, the entries a resume
needs); listing and rotation never follow links out of ``output_dir``; every error names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from taskfit.io.checkpoint_io import CheckpointError, CheckpointIO, FileEntry, deserialize, file_entry, join

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME_PT = "pytorch_model.bin"
MANIFEST_NAME = "manifest.json"
PREFIX = "checkpoint-"
FORMAT = "taskfit-checkpoint"
FORMAT_VERSION = 1
#: file-name prefix of strategy-written shards (FSDP torch.distributed.checkpoint files, DeepSpeed engine files)
SHARDS_PREFIX = "shards/"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# ---- manifest --------------------------------------------------------------------------------------------
def check_entry_name(name: Any, where: str) -> str:
    """``name`` if it is a relative path that stays inside the checkpoint folder.

    Raises:
        CheckpointError: not a string, empty, absolute, with a drive or backslash, or with ``..``/``.`` parts.
    """
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{where}: file name {name!r} is not a non-empty string.")
    parts = name.split("/")
    if (name.startswith("/") or "\\" in name or ":" in parts[0] or "\x00" in name
            or any(p in ("", ".", "..") for p in parts)):
        raise CheckpointError(f"{where}: file name {name!r} leaves the checkpoint folder (absolute paths, '..' "
                              "and empty parts are refused).")
    return name


def validate_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check the schema of a parsed manifest (see the module docstring); returns it.

    Raises:
        CheckpointError: wrong types, an unknown format or newer version, unsafe file names (names ``where``).
    """
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where} is not a taskfit checkpoint manifest (no \"format\": \"{FORMAT}\").")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"{where} has format version {version!r}; this taskfit reads versions 1 to "
                              f"{FORMAT_VERSION}.")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: \"files\" must be an object of {{name: {{size, sha256}}}}, got "
                              f"{type(files).__name__}.")
    for name, entry in files.items():
        check_entry_name(name, where)
        if (not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or isinstance(entry["size"], bool)
                or entry["size"] < 0 or not isinstance(entry.get("sha256"), str)
                or not _SHA256_RE.match(entry["sha256"])):
            raise CheckpointError(f"{where}: the entry of {name!r} must be {{\"size\": int >= 0, \"sha256\": 64 hex "
                                  f"digits}}, got {entry!r}.")
    for key, kind in (("global_step", int), ("world_size", int), ("data_parallel_size", int),
                      ("save_only_model", bool)):
        if key in manifest and not isinstance(manifest[key], kind):
            raise CheckpointError(f"{where}: {key!r} must be {kind.__name__}, got {manifest[key]!r}.")
    return manifest


def read_manifest(io: CheckpointIO, folder: str) -> dict[str, Any]:
    """The validated manifest of ``folder``.

    Raises:
        CheckpointError: no manifest (an incomplete checkpoint, or not a checkpoint folder), ``folder`` is a file,
            or the manifest is unreadable or fails :func:`validate_manifest`.
    """
    path = join(folder, MANIFEST_NAME)
    try:
        data = io.read_bytes(path)
    except FileNotFoundError:
        raise CheckpointError(f"{folder!r} is not a complete checkpoint: it has no {MANIFEST_NAME} (the save was "
                              "interrupted, or this is not a taskfit checkpoint folder).") from None
    except (NotADirectoryError, IsADirectoryError):
        raise CheckpointError(f"{folder!r} is not a checkpoint folder (a checkpoint is a checkpoint-N folder "
                              f"holding {MANIFEST_NAME}).") from None
    return validate_manifest(parse_manifest_json(data, path), repr(path))


#: bytes; a manifest lists one small entry per file (~150 bytes), so 16 MiB is ~100,000 files
MANIFEST_MAX_BYTES = 16 << 20
#: nesting levels; a manifest has 3 (``{"files": {name: {"size", "sha256"}}}``), the rest is room for new keys
MANIFEST_MAX_DEPTH = 8


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON (1 for a scalar), iterative so that no input can exhaust the stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MANIFEST_MAX_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_manifest_json(data: bytes, path: str) -> Any:
    """Parse the bytes of the manifest at ``path``, bounded: at most :data:`MANIFEST_MAX_BYTES` bytes and
    :data:`MANIFEST_MAX_DEPTH` nesting levels, strict JSON (no ``NaN``/``Infinity``), UTF-8.

    Args:
        data (bytes): the file's bytes.
        path (str): where they were read (named in every error).

    Raises:
        CheckpointError: too large, not UTF-8, not valid JSON, or nested deeper than a manifest is (deep nesting
            would otherwise end in a raw ``RecursionError`` inside ``json.loads``).
    """
    if len(data) > MANIFEST_MAX_BYTES:
        raise CheckpointError(f"{path!r} is {len(data)} bytes, larger than any manifest ({MANIFEST_MAX_BYTES} "
                              "bytes at most); it is not a taskfit checkpoint manifest.")
    try:
        manifest = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path!r} is not valid JSON: {exc}") from None
    except RecursionError:
        raise CheckpointError(f"{path!r} is nested deeper than a manifest can be (more than "
                              f"{MANIFEST_MAX_DEPTH} levels); it is not a taskfit checkpoint manifest.") from None
    if _depth(manifest) > MANIFEST_MAX_DEPTH:
        raise CheckpointError(f"{path!r} is nested deeper than a manifest can be (more than {MANIFEST_MAX_DEPTH} "
                              "levels); it is not a taskfit checkpoint manifest.")
    return manifest


def shard_names(manifest: dict[str, Any]) -> list[str]:
    """The strategy-written files (``shards/...``) of a manifest."""
    return [n for n in manifest["files"] if n.startswith(SHARDS_PREFIX)]


def require_entries(manifest: dict[str, Any], folder: str, names: list[str], why: str) -> None:
    """Raise :class:`CheckpointError` naming the first of ``names`` the manifest does not list."""
    for name in names:
        if name not in manifest["files"]:
            raise CheckpointError(f"{join(folder, name)!r} is not listed in the checkpoint's manifest, but {why}.")


class CheckpointReader:
    """Reads the files of one complete checkpoint, each file once: the bytes read are checked against the
    manifest (size and SHA-256) and the same bytes are deserialised or handed to a backend.

    Args:
        io (CheckpointIO): the plugin to read through.
        folder (str): the ``checkpoint-N`` folder (path or URL).
        manifest (dict | None): its already validated manifest (read here when None).
        weights_only (bool): refuse files that need arbitrary unpickling (default; backends that load files
            themselves, such as the DeepSpeed engine, follow this too). False only for trusted checkpoints.

    Raises:
        CheckpointError: see :func:`read_manifest`.
    """

    def __init__(self, io: CheckpointIO, folder: str, manifest: dict[str, Any] | None = None,
                 weights_only: bool = True) -> None:
        self.io, self.folder, self.weights_only = io, folder, weights_only
        self.manifest = manifest if manifest is not None else read_manifest(io, folder)
        self._lock = threading.Lock()
        #: names whose bytes were read and verified (:meth:`unverified` lists the others)
        self.verified: set[str] = set()

    @property
    def files(self) -> dict[str, FileEntry]:
        return self.manifest["files"]

    def read_bytes(self, name: str) -> bytes:
        """The verified bytes of ``name``.

        Raises:
            CheckpointError: not in the manifest, missing, unreadable, truncated or corrupted (names the file).
        """
        path = join(self.folder, name)
        expected = self.files.get(name)
        if expected is None:
            raise CheckpointError(f"{path!r} is not listed in the checkpoint's manifest.")
        try:
            data = self.io.read_bytes(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise CheckpointError(f"Checkpoint file {path!r} is missing (listed in the manifest).") from None
        except OSError as exc:  # a failing disk or store
            raise CheckpointError(f"Could not read checkpoint file {path!r}: {exc.strerror or exc}") from exc
        _check_entry(path, file_entry(data), expected)
        self.verified.add(name)
        return data

    def unverified(self) -> list[str]:
        """The listed names not yet verified by this reader (a reader of a folder without recorded hashes, such
        as a ``transformers.Trainer`` checkpoint, has nothing to verify: empty)."""
        done = getattr(self, "verified", set())
        return [n for n, e in self.files.items() if n not in done and _SHA256_RE.match(str(e.get("sha256", "")))]

    def verify(self, name: str) -> None:
        """Check the size and SHA-256 of listed file ``name`` without keeping its bytes: a local file is hashed in
        1 MiB blocks (its size is checked first, so a truncated file costs no read), a remote one is read whole.

        Raises:
            CheckpointError: not listed, missing, unreadable, truncated or corrupted (names the file).
        """
        if not self.io.is_local(self.folder):
            self.read_bytes(name)
            return
        path, expected = join(self.folder, name), self.files.get(name)
        if expected is None:
            raise CheckpointError(f"{path!r} is not listed in the checkpoint's manifest.")
        inner = self.io.fs(path)[1]
        try:
            size = os.stat(inner).st_size
            got = _hash_file(inner) if size == expected["size"] else {"size": size, "sha256": "?" * 64}
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise CheckpointError(f"Checkpoint file {path!r} is missing (listed in the manifest).") from None
        except OSError as exc:  # a failing disk
            raise CheckpointError(f"Could not read checkpoint file {path!r}: {exc.strerror or exc}") from exc
        _check_entry(path, got, expected)
        self.verified.add(name)

    def read(self, name: str, weights_only: bool | None = None, map_location: Any = "cpu") -> Any:
        """Read, verify and deserialise ``name`` (see :func:`~taskfit.io.checkpoint_io.deserialize`).

        Raises:
            CheckpointError: see :meth:`read_bytes`, or bytes that do not parse as their format (names the file).
            UnsafeCheckpointError: the file needs full unpickling and ``weights_only`` is True.
        """
        from taskfit.io.checkpoint_io import UnsafeCheckpointError

        data = self.read_bytes(name)
        weights_only = self.weights_only if weights_only is None else weights_only
        try:
            return deserialize(join(self.folder, name), data, map_location=map_location, weights_only=weights_only)
        except UnsafeCheckpointError:
            raise
        except Exception as exc:  # garbage that matches its manifest entry: name the file, not the parser
            raise CheckpointError(f"Checkpoint file {join(self.folder, name)!r} cannot be read as "
                                  f"{_kind(name)}: {type(exc).__name__}: {str(exc)[:200]}") from None


def _check_entry(path: str, got: FileEntry, expected: FileEntry) -> None:
    """Raise :class:`CheckpointError` naming ``path`` when its size or SHA-256 differ from the manifest's."""
    if got != expected:
        what = "truncated" if got["size"] < expected["size"] else "corrupted"
        raise CheckpointError(f"Checkpoint file {path!r} is {what}: {got['size']} bytes with SHA-256 "
                              f"{got['sha256'][:12]}..., the manifest says {expected['size']} bytes with "
                              f"{expected['sha256'][:12]}...")


def _hash_file(path: str, sync: bool = False) -> FileEntry:
    """Size and SHA-256 of local file ``path``, read in 1 MiB blocks; ``sync``: ``fsync`` it too."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
        if sync:
            os.fsync(fh.fileno())
    return {"size": size, "sha256": digest.hexdigest()}


def _kind(name: str) -> str:
    if name.endswith(".json"):
        return "UTF-8 JSON"
    if name.endswith(".safetensors"):
        return "safetensors"
    return "a torch.save file"


def read_file(io: CheckpointIO, folder: str, name: str, manifest: dict[str, Any], weights_only: bool = True,
              map_location: Any = "cpu") -> Any:
    """Read, verify (size and SHA-256 against ``manifest``) and deserialise ``folder/name`` (one read).

    Raises:
        CheckpointError: the file is not in the manifest, missing, truncated, corrupted or unparsable.
        UnsafeCheckpointError: it needs full unpickling and ``weights_only`` is True.
    """
    return CheckpointReader(io, folder, manifest).read(name, weights_only, map_location)


# ---- writing ---------------------------------------------------------------------------------------------
def fsync_path(path: str, directory: bool = False) -> None:
    """``fsync`` a local file or folder so its data (or its entries) survive a power loss. Folders are opened
    read-only (POSIX); where a platform cannot sync a folder this is a no-op."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


class BackgroundResult:
    """A value computed on a thread of its own (named ``taskfit-shard-hash``). :meth:`result` waits at most
    ``timeout`` seconds and then joins the thread, so no hashing thread outlives the save that reads its result
    (a thread left running at interpreter exit is a shutdown hazard). Duck-types ``Future.result``."""

    def __init__(self, fn: Callable[[], Any], name: str = "taskfit-shard-hash") -> None:
        self._future: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._future.set_result(fn())
        except BaseException as exc:  # handed to the caller of result()
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Any:
        """The value (or the exception raised computing it); ``TimeoutError`` after ``timeout`` seconds."""
        try:
            return self._future.result(timeout=timeout)
        finally:
            if self._future.done():
                self._thread.join()  # the value is set: the thread is returning


def hash_files_in_background(io: CheckpointIO, folder: str, names: list[str]) -> BackgroundResult:
    """Start hashing (and, on the local disk, syncing) the files ``names`` that a backend wrote into ``folder``
    (torch.distributed.checkpoint or DeepSpeed shards) on a background thread; the returned
    :class:`BackgroundResult` gives ``{name: {"size", "sha256"}}`` (and joins the thread). The training thread
    does not read them back. The page cache usually still holds the bytes just written, so this costs no disk
    read."""
    local = io.is_local(folder)

    def run() -> dict[str, FileEntry]:
        out = {}
        for name in names:
            path = join(folder, name)
            out[name] = _hash_file(io.fs(path)[1], sync=True) if local else file_entry(io.read_bytes(path))
        return out

    return BackgroundResult(run)


def synchronous_io(io: CheckpointIO) -> CheckpointIO:
    """The plugin that does the actual writing: the wrapped one of an async plugin (code running on the async
    plugin's own thread must not wait for that thread), else ``io`` itself."""
    while hasattr(io, "checkpoint_io") and isinstance(io.checkpoint_io, CheckpointIO):
        io = io.checkpoint_io
    return io


class ManifestWriter:
    """Completes a checkpoint after the writing rank's files are written (on the background thread for async
    saves): waits (at most ``timeout`` seconds) for the other ranks' parts, adds the backend-written shard
    entries, syncs the files and the folder (local disk), writes the manifest, renames the folder into place
    and rotates old checkpoints. All IO goes through the synchronous plugin (never waiting for its own thread).

    Args:
        io (CheckpointIO): the run's plugin (async or not).
        target (str): the folder being written (``checkpoint-N.tmp`` on the local disk, else ``checkpoint-N``).
        final (str): ``checkpoint-N``.
        manifest (dict): the manifest's header fields (``files`` is added here).
        ranks (list[int]): the ranks whose files go into this folder; ``rank`` is this one.
        output_dir (str): where rotation happens; ``limit``: ``save_total_limit``; ``keep``: never deleted.
        timeout (float): seconds to wait for other ranks' parts (``ddp_timeout``).
        shard_hashes (BackgroundResult | None): from :func:`hash_files_in_background`.
    """

    def __init__(self, io: CheckpointIO, target: str, final: str, manifest: dict, ranks: list[int], rank: int,
                 output_dir: str, limit: int | None, keep: set[str | None], timeout: float,
                 shard_hashes: BackgroundResult | None = None) -> None:
        self.io, self.target, self.final, self.manifest = synchronous_io(io), target, final, manifest
        self.ranks, self.rank, self.output_dir, self.limit = ranks, rank, output_dir, limit
        self.keep, self.timeout, self.shard_hashes = keep, timeout, shard_hashes

    def __call__(self, entries: dict[str, FileEntry]) -> None:
        io, files = self.io, dict(entries)
        deadline = time.monotonic() + self.timeout
        if self.shard_hashes is not None:
            files.update(self.shard_hashes.result(timeout=self.timeout))
        for r in self.ranks:
            if r == self.rank:
                continue
            part = join(self.target, f".part-{r}.json")
            while not io.exists(part):
                if time.monotonic() > deadline:
                    raise CheckpointError(f"Rank {r} did not finish its part of {self.final} within "
                                          f"{self.timeout:.0f} s; the checkpoint stays incomplete.")
                time.sleep(0.05)
            files.update(json.loads(io.read_bytes(part)))
            io.remove_checkpoint(part)
        manifest = {**self.manifest, "files": dict(sorted(files.items()))}
        local = io.is_local(self.target)
        inner = io.fs(self.target)[1] if local else ""
        # every file was synced when written (atomic writes, DCP's sync_files, the shard hasher); the folders'
        # entries reach the disk before the manifest exists, the manifest's own entry before the rename
        folders = {os.path.dirname(os.path.join(inner, *n.split("/"))) for n in files} if local else set()
        for d in sorted(folders, key=len, reverse=True):
            fsync_path(d, directory=True)
        io.write_bytes(join(self.target, MANIFEST_NAME), json.dumps(manifest, indent=2).encode())
        if local:
            fsync_path(inner, directory=True)
        if self.target != self.final:
            io.rename(self.target, self.final)
        if local:
            fsync_path(os.path.dirname(io.fs(self.final)[1].rstrip("/")) or ".", directory=True)
        if self.limit:
            rotate_checkpoints(io, self.output_dir, self.limit, keep=self.keep | {self.final})


def part_writer(io: CheckpointIO, target: str, rank: int, shard_hashes: BackgroundResult | None = None,
                timeout: float = 1800.0) -> Any:
    """The ``finalize`` of a non-writing rank: write ``.part-{rank}.json`` listing its files (with its shard
    entries) for the writing rank's :class:`ManifestWriter` (its files were synced when written)."""
    sync = synchronous_io(io)

    def finalize(entries: dict[str, FileEntry]) -> None:
        files = dict(entries)
        if shard_hashes is not None:
            files.update(shard_hashes.result(timeout=timeout))
        sync.write_bytes(join(target, f".part-{rank}.json"), json.dumps(files).encode())

    return finalize


# ---- listing and rotation --------------------------------------------------------------------------------
def _inside(io: CheckpointIO, output_dir: str, path: str) -> bool:
    """False for a local ``path`` that is a link or resolves outside ``output_dir``."""
    if not io.is_local(path):
        return True
    inner, root = io.fs(path)[1], io.fs(output_dir)[1]
    if os.path.islink(inner):
        return False
    real, base = os.path.realpath(inner), os.path.realpath(root)
    return os.path.commonpath([real, base]) == base and real != base


def list_checkpoints(io: CheckpointIO, output_dir: str, complete_only: bool = True) -> list[tuple[int, str]]:
    """``[(global_step, path)]`` of the checkpoints in ``output_dir``, oldest first; with ``complete_only``
    (default) only those whose manifest exists. Links (``checkpoint-N`` pointing elsewhere) are ignored."""
    out = []
    for name in io.listdir(output_dir):
        m = _CHECKPOINT_RE.match(name)
        if m:
            path = join(output_dir, name)
            if not _inside(io, output_dir, path):
                continue
            if not complete_only or io.exists(join(path, MANIFEST_NAME)):
                out.append((int(m.group(1)), path))
    return sorted(out)


def rotate_checkpoints(io: CheckpointIO, output_dir: str, limit: int, keep: set[str | None]) -> list[str]:
    """Delete the oldest complete checkpoints until at most ``limit`` remain, never one in ``keep`` (the newest and
    the best) and never anything outside ``output_dir`` (links are not followed); mirrors HF
    ``save_total_limit`` (which keeps the best one too). Returns the deleted paths."""
    io = synchronous_io(io)
    ckpts = [p for _, p in list_checkpoints(io, output_dir)]
    norm = {str(k).rstrip("/") for k in keep if k}
    removable = [p for p in ckpts if p.rstrip("/") not in norm]
    excess = len(ckpts) - max(int(limit), len([p for p in ckpts if p.rstrip("/") in norm]))
    deleted = []
    for p in removable[:max(0, excess)]:
        if not _inside(io, output_dir, p):  # re-checked right before deleting
            continue
        io.remove_checkpoint(join(p, MANIFEST_NAME))  # incomplete first, so a crash mid-delete is never picked
        io.remove_checkpoint(p)
        deleted.append(p)
    return deleted


__all__ = ["BackgroundResult", "CheckpointError", "CheckpointReader", "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME",
           "ManifestWriter", "PREFIX", "SHARDS_PREFIX", "WEIGHTS_NAME", "WEIGHTS_NAME_PT", "check_entry_name",
           "fsync_path", "hash_files_in_background", "list_checkpoints", "part_writer", "read_file", "read_manifest",
           "require_entries", "rotate_checkpoints", "shard_names", "synchronous_io", "validate_manifest"]
