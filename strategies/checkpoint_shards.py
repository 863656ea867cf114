"""Sharded checkpoints written with ``torch.distributed.checkpoint`` (DCP) under ``checkpoint-N/shards/`` and their
conversion to one full state dict (F-CKPT-5). Shared by the FSDP strategy (which writes and reads them across
ranks) and the base strategy (which loads them into a single-device or DDP run through the conversion).

Layout: ``shards/__{rank}_0.distcp`` (one file per rank: its shards of the model and optimizer state) and
``shards/.metadata`` (written by rank 0: which rank holds which piece). The state saved is
``{"model": model state dict, "optim": optimizer state dict}`` as ``torch.distributed.checkpoint.state_dict``
returns them (keys are the model's parameter names, the same as a single-device ``state_dict()``).

Optimizer state dicts come in two key forms: by parameter *name* (DCP / ``get_optimizer_state_dict``) and by
parameter *index* (``torch.optim.Optimizer.state_dict()``); :func:`optimizer_state_by_index` and
:func:`optimizer_state_by_name` convert between them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

SHARDS_DIR = "shards"
METADATA_NAME = ".metadata"


def shard_folder(folder: str) -> str:
    """``folder/shards``: where a checkpoint's DCP files live."""
    return os.path.join(folder, SHARDS_DIR)


def is_dcp_checkpoint(names: list[str]) -> bool:
    """True when the checkpoint file ``names`` (relative to the checkpoint folder) hold a DCP shard set."""
    return f"{SHARDS_DIR}/{METADATA_NAME}" in names


def rank_file_names(rank: int, with_metadata: bool) -> list[str]:
    """The file names (relative to the checkpoint folder) DCP's ``FileSystemWriter`` writes for ``rank``."""
    names = [f"{SHARDS_DIR}/__{rank}_0.distcp"]
    return names + [f"{SHARDS_DIR}/{METADATA_NAME}"] if with_metadata else names


def local_folder(io: Any, folder: str) -> str:
    """The local path of ``folder`` for DCP (which writes plain files).

    Raises:
        ValueError: ``folder`` is a remote (fsspec) URL.
    """
    if io is not None and not io.is_local(folder):
        raise ValueError(f"Sharded FSDP checkpoints are written with torch.distributed.checkpoint to a local folder; "
                         f"{folder!r} is remote. Use a local output_dir, or fsdp_config state_dict_type='full' (rank 0 "
                         "writes full files through the checkpoint IO).")
    return io.fs(folder)[1] if io is not None else folder


#: the globals a DCP ``.metadata`` pickle may name: DCP's own metadata classes and the torch values they hold
_DCP_MODULE_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint._extension": {"StreamTransformExtension", "ZStandard", "ExtensionRegistry"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size", "device", "memory_format", "layout"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def _allowed_dcp_global(module: str, name: str) -> bool:
    if name in _DCP_MODULE_CLASSES.get(module, ()):
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


def load_dcp_metadata(data: bytes, where: str) -> Any:
    """Unpickle the bytes of a DCP ``.metadata`` file allowing only DCP's own metadata classes and plain torch
    values (sizes, dtypes, layouts, memory formats); anything else (a callable that could run code) is refused.

    Raises:
        UnsafeCheckpointError: the pickle names another global (names the file and the global).
    """
    import io
    import pickle

    from taskfit.io.checkpoint_io import UnsafeCheckpointError

    class _Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if _allowed_dcp_global(module, name):
                return super().find_class(module, name)
            raise UnsafeCheckpointError(
                f"Refusing to load {where}: its pickle refers to {module}.{name}, which is not one of "
                "torch.distributed.checkpoint's metadata classes; unpickling it could run arbitrary code.")

    return _Restricted(io.BytesIO(data)).load()


def dcp_reader(path: str, read_bytes: Callable[[str], bytes] | None = None, weights_only: bool = True) -> Any:
    """A ``torch.distributed.checkpoint`` storage reader for the shard folder ``path`` that reads every file once
    through ``read_bytes(file name)`` (default: the plain file; pass a manifest-verifying reader to check sizes
    and SHA-256 on the same bytes that are loaded), unpickles ``.metadata`` with :func:`load_dcp_metadata` and
    loads non-tensor values with ``torch.load(weights_only=True)`` (DCP's own planner would unpickle them fully).
    ``weights_only=False`` (trusted checkpoints only) restores DCP's plain unpickling."""
    import contextlib
    import io
    from pathlib import Path

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    from taskfit.io.checkpoint_io import deserialize

    def plain(name: str) -> bytes:
        with open(os.path.join(path, name), "rb") as fh:
            return fh.read()

    source = read_bytes or plain
    cache: dict[str, bytes] = {}

    def blob(name: str) -> bytes:
        if name not in cache:
            cache[name] = source(name)
        return cache[name]

    class _VerifiedFS(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, p: Any, mode: str) -> Any:
            if "r" not in mode:
                raise ValueError("this storage reader only reads")
            yield io.BytesIO(blob(Path(p).name))

    class _SafeBytes:
        """The planner, except that non-tensor values are loaded with ``weights_only=True``."""

        def __init__(self, planner: Any) -> None:
            self._planner = planner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._planner, name)

        def load_bytes(self, read_item: Any, value: Any) -> None:
            data = value.read()
            # refused here unless weights_only=True can load it; the planner then unpickles the same, proven bytes
            if weights_only:
                deserialize(f"{SHARDS_DIR}/{read_item.storage_index.fqn}", data)
            self._planner.load_bytes(read_item, io.BytesIO(data))

    def parse(name: str) -> Any:
        if weights_only:
            return load_dcp_metadata(blob(name), repr(os.path.join(path, name)))
        import pickle

        return pickle.loads(blob(name))

    # read (and refuse) the metadata here: DCP swallows errors of read_metadata and retries other file names
    global_metadata = parse(METADATA_NAME)

    class _Reader(FileSystemReader):
        def __init__(self) -> None:
            super().__init__(path)
            self.fs = _VerifiedFS()

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            metadata = global_metadata if rank is None else parse(f"__{rank}{METADATA_NAME}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            return super().read_data(plan, _SafeBytes(planner))

    return _Reader()


def read_full_state_dict(folder: str, read_bytes: Callable[[str], bytes] | None = None,
                         weights_only: bool = True) -> dict[str, Any]:
    """Read a DCP shard set in one process, with no process group: ``{"model": {name: tensor}, "optim":
    {"state": {name: {...}}, "param_groups": [...]}}`` with full (unsharded) CPU tensors. Mirrors
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``, with safe loading (see :func:`dcp_reader`).

    Args:
        folder (str): the checkpoint folder (holding ``shards/``) or the ``shards`` folder itself.
        read_bytes (callable | None): ``shard file name -> bytes`` (e.g. verified against the manifest).

    Raises:
        FileNotFoundError: no ``.metadata`` there.
        UnsafeCheckpointError: ``.metadata`` or a value needs arbitrary unpickling.
    """
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = folder if os.path.exists(os.path.join(folder, METADATA_NAME)) else shard_folder(folder)
    if read_bytes is None and not os.path.exists(os.path.join(path, METADATA_NAME)):
        raise FileNotFoundError(f"No torch.distributed.checkpoint shards in {folder!r} (no {METADATA_NAME}).")
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=dcp_reader(path, read_bytes, weights_only),
                     planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return state


def verified_shard_bytes(reader: Any) -> Callable[[str], bytes]:
    """``shard file name -> bytes`` checked against the manifest of ``reader`` (a
    :class:`~taskfit.io.checkpoint_format.CheckpointReader`)."""
    return lambda name: reader.read_bytes(f"{SHARDS_DIR}/{name}")


def optimizer_state_by_index(osd: dict[str, Any]) -> dict[str, Any]:
    """Name-keyed optimizer state (``get_optimizer_state_dict``) -> ``torch.optim.Optimizer.state_dict()`` form:
    parameters numbered 0, 1, ... in the order of ``param_groups[*]["params"]``."""
    ids: dict[str, int] = {}
    groups = []
    for group in osd["param_groups"]:
        params = []
        for name in group["params"]:
            ids.setdefault(name, len(ids))
            params.append(ids[name])
        groups.append({**group, "params": params})
    state = {ids[name]: value for name, value in osd["state"].items() if name in ids}
    return {"state": state, "param_groups": groups}


def optimizer_state_by_name(osd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``torch.optim.Optimizer.state_dict()`` form -> name-keyed, given the parameter ``names`` in the optimizer's
    order (``names[i]`` is parameter ``i``).

    Raises:
        ValueError: the state numbers more parameters than ``names`` has.
    """
    count = sum(len(g["params"]) for g in osd["param_groups"])
    if count != len(names):
        raise ValueError(f"The optimizer state covers {count} parameters but the optimizer has {len(names)}.")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": {names[i]: v for i, v in osd["state"].items()}, "param_groups": groups}


def parameter_names(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of ``optimizer``'s parameters (in its order) inside ``module``.

    Raises:
        ValueError: the optimizer holds a parameter that is not in ``module``.
    """
    by_id = {id(p): n for n, p in module.named_parameters(remove_duplicate=False)}
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in by_id:
                raise ValueError(f"The optimizer holds a parameter of shape {tuple(p.shape)} that is not in "
                                 f"{type(module).__name__}.")
            out.append(by_id[id(p)])
    return out


def load_full_into(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]) -> None:
    """Load a full ``{"model", "optim"}`` state (from :func:`read_full_state_dict`) into an unsharded ``module``
    and its ``optimizer`` (single device, DDP). Strict: every key must match.

    Raises:
        ValueError: missing or unexpected keys (named), or an optimizer state for other parameters.
    """
    result = module.load_state_dict(state["model"], strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"The sharded checkpoint does not match {type(module).__name__}: missing keys "
                         f"{result.missing_keys[:5]}, unexpected keys {result.unexpected_keys[:5]}.")
    if optimizer is not None and state.get("optim"):
        names = parameter_names(module, optimizer)
        osd = state["optim"]
        known = {n for g in osd["param_groups"] for n in g["params"]}
        if set(names) != known:
            raise ValueError(f"The checkpoint's optimizer state covers other parameters than the optimizer: "
                             f"{sorted(known ^ set(names))[:5]}.")
        # renumber in this optimizer's order
        ordered = {**osd, "param_groups": [{**g, "params": [n for n in names if n in set(g["params"])]}
                                           for g in osd["param_groups"]]}
        optimizer.load_state_dict(optimizer_state_by_index(ordered))


def convert_checkpoint(folder: str, output_dir: str | None = None, safe_serialization: bool = True) -> dict[str, Any]:
    """Convert an FSDP sharded checkpoint into full files: ``model.safetensors`` (or ``pytorch_model.bin``) and
    ``optimizer.pt`` (index-keyed, as ``Optimizer.state_dict()``) in ``output_dir`` when given. Returns the full
    ``{"model", "optim"}`` state (``optim`` name-keyed). Runs in one process, no process group needed.

    Args:
        folder (str): a ``checkpoint-N`` folder written under FSDP (or its ``shards`` folder).
        output_dir (str | None): where to write the files (created); None writes nothing.
        safe_serialization (bool): safetensors (default) or ``torch.save`` for the weights.

    Raises:
        FileNotFoundError: ``folder`` holds no DCP shards.
    """
    from taskfit.io.checkpoint_format import MANIFEST_NAME, CheckpointReader
    from taskfit.io.checkpoint_io import TorchCheckpointIO, safetensors_bytes

    read = None
    if os.path.exists(os.path.join(folder, MANIFEST_NAME)):  # a checkpoint folder: verify every shard as it is read
        read = verified_shard_bytes(CheckpointReader(TorchCheckpointIO(), folder))
    state = read_full_state_dict(folder, read)
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        model = {k: v.contiguous() for k, v in state["model"].items()}
        if safe_serialization:
            with open(os.path.join(output_dir, "model.safetensors"), "wb") as fh:
                fh.write(safetensors_bytes(model))
        else:
            torch.save(model, os.path.join(output_dir, "pytorch_model.bin"))
        if state.get("optim"):
            torch.save(optimizer_state_by_index(state["optim"]), os.path.join(output_dir, "optimizer.pt"))
    return state
