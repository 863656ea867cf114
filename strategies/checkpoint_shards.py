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


def read_full_state_dict(folder: str) -> dict[str, Any]:
    """Read a DCP shard set in one process, with no process group: ``{"model": {name: tensor}, "optim":
    {"state": {name: {...}}, "param_groups": [...]}}`` with full (unsharded) CPU tensors. Mirrors
    ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``.

    Args:
        folder (str): the checkpoint folder (holding ``shards/``) or the ``shards`` folder itself.

    Raises:
        FileNotFoundError: no ``.metadata`` there.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = folder if os.path.exists(os.path.join(folder, METADATA_NAME)) else shard_folder(folder)
    if not os.path.exists(os.path.join(path, METADATA_NAME)):
        raise FileNotFoundError(f"No torch.distributed.checkpoint shards in {folder!r} (no {METADATA_NAME}).")
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


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
    from taskfit.io.checkpoint_io import safetensors_bytes

    state = read_full_state_dict(folder)
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
