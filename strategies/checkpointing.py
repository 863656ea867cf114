"""A checkpoint folder for any strategy (F-CKPT-1, F-CKPT-4, F-CKPT-5): the part of saving and loading that sits
between the writer (:mod:`taskfit.checkpoint.writer`, which decides the files a run contributes) and the bytes
(:mod:`taskfit.io`). :class:`~taskfit.strategies.strategy.Strategy`'s ``save_checkpoint``/``load_checkpoint`` call
these functions; nothing here reaches back up.

Saving (:func:`save_folder`): the writing rank clears the folder, every rank meets at a barrier, the strategy writes
its shards (FSDP, DeepSpeed) or contributes the full model weights and optimizer states, every rank writes its
files, and the writing rank writes the manifest last (atomic rename on the local disk). Loading
(:func:`load_states`): the model and optimizer states from the strategy's shards or from the full files, each file
read once and verified against the manifest. The format itself lives in :mod:`taskfit.io.checkpoint_format`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from taskfit.__about__ import __version__
from taskfit.io.checkpoint_format import (
    FORMAT, FORMAT_VERSION, MANIFEST_NAME, WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, CheckpointReader,
    ManifestWriter, check_entry_name, hash_files_in_background, part_writer, require_entries, shard_names,
)
from taskfit.io.checkpoint_io import join
from taskfit.io.peft_files import adapter_files, has_adapter_files, is_peft_model, load_adapter_files


def exportable_model(model: torch.nn.Module) -> torch.nn.Module:
    """What ``save_model`` writes: the model itself, or, for a module that only wraps one HF-style model (a
    child with ``save_pretrained`` holding every parameter), that child, so the folder loads with
    ``from_pretrained``."""
    if hasattr(model, "save_pretrained"):
        return model
    children = [m for m in model.children() if hasattr(m, "save_pretrained")]
    if len(children) == 1:
        n_all = sum(p.numel() for p in model.parameters())
        if sum(p.numel() for p in children[0].parameters()) == n_all:
            return children[0]
    return model


def weight_files(model: torch.nn.Module, weights: dict[str, torch.Tensor], weights_name: str) -> dict[str, Any]:
    """Which weights ``model`` (an exported model, see :func:`exportable_model`) contributes to a checkpoint or
    model folder: ``{weights_name: weights}`` (its full state dict), or for a PEFT model only its adapters, in
    PEFT's layout (``adapter_model.safetensors`` + ``adapter_config.json``, :mod:`taskfit.io.peft_files`), as
    ``transformers.Trainer`` saves a ``PeftModel``: the frozen base is not written.

    Args:
        model (nn.Module): the exported model.
        weights (dict[str, Tensor]): its full state dict (the adapters' tensors are taken from it).
        weights_name (str): ``model.safetensors`` or ``pytorch_model.bin`` (then ``adapter_model.bin``).
    """
    if is_peft_model(model):
        return adapter_files(model, weights, safetensors=weights_name != WEIGHTS_NAME_PT)
    return {weights_name: weights}


def states_on_cpu(strategy: Any, state: Any) -> Any:
    """``state`` with device tensors (CUDA, XLA, MPS) moved to the CPU, so the file loads anywhere (``Fit``
    checkpoints and ``Engine.save``)."""
    if strategy.root_device.type == "cpu":
        return state
    from lightning_utilities.core.apply_func import apply_to_collection

    return apply_to_collection(state, torch.Tensor, lambda t: t.detach().cpu())


def optimizer_file(i: int) -> str:
    """``optimizer.pt`` for the first optimizer, ``optimizer_{i}.pt`` for the others."""
    return "optimizer.pt" if i == 0 else f"optimizer_{i}.pt"


def manifest_header(global_step: int, world_size: int, save_only_model: bool = False,
                    data_parallel_size: int | None = None) -> dict[str, Any]:
    """The manifest's fields besides ``files`` (schema: :mod:`taskfit.io.checkpoint_format`);
    ``data_parallel_size`` only under tensor parallelism (fewer processes reading data than processes)."""
    header = {"format": FORMAT, "version": FORMAT_VERSION, "global_step": int(global_step), "world_size": world_size,
              "save_only_model": bool(save_only_model), "taskfit_version": __version__,
              "torch_version": torch.__version__}
    if data_parallel_size is not None:
        header["data_parallel_size"] = data_parallel_size
    return header


@dataclasses.dataclass
class FolderPlan:
    """How one checkpoint folder is finished.

    Args:
        manifest (dict): the manifest header (:func:`manifest_header`); with ``save_only_model`` true the strategy
            writes no shards and no optimizer state, only the full weights.
        writer (bool): this process writes the shared files and the manifest.
        ranks (list[int]): the ranks whose files go into this folder (each writes a ``.part-{rank}.json``).
        output_dir (str): where rotation happens (``save_total_limit``).
        limit (int | None): ``save_total_limit`` (None: no rotation).
        keep (set[str]): checkpoints rotation never deletes (the best one).
        timeout (float): seconds the writer waits for the other ranks' parts (``ddp_timeout``).
        weights_name (str): ``model.safetensors`` or ``pytorch_model.bin`` (``save_safetensors=False``).
        hf_groups (list[tuple[int, float]]): empty optimizer groups to insert into ``optimizer.pt`` and
            ``scheduler.pt`` so ``transformers.Trainer`` resumes from the folder
            (:func:`taskfit.io.hf_checkpoint.hf_missing_groups`); empty: none.
    """

    manifest: dict[str, Any]
    writer: bool
    ranks: list[int]
    output_dir: str
    limit: int | None = None
    keep: set[str | None] = dataclasses.field(default_factory=set)
    timeout: float = 1800.0
    weights_name: str = WEIGHTS_NAME
    hf_groups: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    @classmethod
    def default(cls, strategy: Any, folder: str) -> FolderPlan:
        """One folder of step 0 written by global rank 0 for every rank, no rotation."""
        parent = folder.rstrip("/").rsplit("/", 1)[0] if "/" in folder.rstrip("/") else "."
        return cls(manifest_header(0, strategy.world_size), strategy.is_global_zero,
                   list(range(strategy.world_size)), parent)


def _prepare(io: Any, final: str, target: str, writer: bool) -> None:
    """The writing rank clears what an earlier save of this folder left (its manifest first)."""
    if not writer:
        return
    io.wait()  # an earlier save of this same folder may still be in flight
    if io.is_local(final) and os.path.islink(io.fs(final)[1]):
        io.remove_checkpoint(final)  # a link named like this checkpoint: drop the link, never its target
    io.remove_checkpoint(join(final, MANIFEST_NAME))  # re-saving a step: never leave an old manifest over new files
    io.remove_checkpoint(target)


def _add_states(strategy: Any, files: dict[str, Any], module: torch.nn.Module | None, optimizers: Sequence[Any],
                plan: FolderPlan) -> None:
    """Add the full weights (a collective for sharded strategies: every rank takes part, only the writer keeps
    them) and, unless ``save_only_model``, the optimizer states in the ``Optimizer.state_dict()`` form."""
    if module is not None:
        model = exportable_model(module)
        weights = strategy.model_state_dict(model)
        if plan.writer:
            files.update(weight_files(model, weights, plan.weights_name))
    if not plan.writer or plan.manifest.get("save_only_model"):
        return
    for i, opt in enumerate(optimizers):
        files[optimizer_file(i)] = states_on_cpu(strategy, opt.state_dict())
    if plan.hf_groups and "optimizer.pt" in files:
        from taskfit.io.hf_checkpoint import pad_groups

        files["optimizer.pt"], sched = pad_groups(files["optimizer.pt"], files.get("scheduler.pt"), plan.hf_groups)
        if sched is not None:
            files["scheduler.pt"] = sched


def save_folder(strategy: Any, folder: str, files: dict[str, Any], module: torch.nn.Module | None,
                optimizers: Sequence[Any], plan: FolderPlan) -> str:
    """Write checkpoint ``folder`` (``Strategy.save_checkpoint`` calls this; every process must): ``files`` (this
    rank's ``{name: object}`` from the writer) plus ``module``'s and ``optimizers``' states: the strategy's shards
    (:meth:`~taskfit.strategies.strategy.Strategy.save_checkpoint_shards`, hashed on a background thread) or
    the full weights and ``optimizer.pt``/``optimizer_{i}.pt``; through the strategy's checkpoint IO (in the
    background with ``AsyncCheckpointIO``); the writing rank writes the manifest last, on the local disk into
    ``folder.tmp`` renamed into place.

    Returns:
        str: ``folder`` (complete once its manifest exists).

    Raises:
        ValueError: several optimizers under a strategy that writes the optimizer state as shards.
    """
    io, rank = strategy.checkpoint_io, strategy.global_rank
    final = folder.rstrip("/") or folder
    target = final + ".tmp" if io.is_local(final) else final
    _prepare(io, final, target, plan.writer)
    strategy.barrier("checkpoint-prepare")
    shards = None
    if module is not None and not plan.manifest.get("save_only_model"):
        shards = strategy.save_checkpoint_shards(module, optimizers[0] if optimizers else None, target)
    if shards is not None and len(optimizers) > 1:
        raise ValueError(f"strategy={strategy.name!r} writes the optimizer state as shards, one optimizer per "
                         f"checkpoint; got {len(optimizers)} optimizers.")
    files = dict(files)
    if shards is None:
        _add_states(strategy, files, module, optimizers, plan)
    elif module is not None and is_peft_model(exportable_model(module)):
        # the shards hold the adapter and optimizer for resume; PEFT's files (gathered: a collective) let
        # PeftModel.from_pretrained read the checkpoint, as transformers.Trainer's adapter checkpoints
        model = exportable_model(module)
        weights = strategy.adapter_state_dict(model)
        if plan.writer:
            files.update(weight_files(model, weights, plan.weights_name))
    # backend-written shards are hashed (and synced) on a background thread while the other files are written
    hashes = hash_files_in_background(io, target, list(shards)) if shards else None
    if plan.writer:
        finalize: Any = ManifestWriter(io, target, final, plan.manifest, plan.ranks, rank, plan.output_dir,
                                       plan.limit, plan.keep, plan.timeout, hashes)
    else:
        finalize = part_writer(io, target, rank, hashes, plan.timeout)
    io.save_files(files, target, finalize)
    return folder


# ---- loading ---------------------------------------------------------------------------------------------
def open_checkpoint(io: Any, path: str, weights_only: bool = True) -> CheckpointReader:
    """The reader of checkpoint ``path``: a taskfit checkpoint (verified against its manifest), or one written by
    ``transformers.Trainer`` (:class:`~taskfit.io.hf_checkpoint.HFCheckpointReader`, which makes the entries a
    resume reads from HF's files).

    Raises:
        CheckpointError: neither a complete taskfit checkpoint nor a transformers one.
    """
    from taskfit.io.hf_checkpoint import HFCheckpointReader, is_hf_checkpoint

    if is_hf_checkpoint(io, path):
        return HFCheckpointReader(io, path, weights_only=weights_only)
    return CheckpointReader(io, path, weights_only=weights_only)


@dataclasses.dataclass
class LoadedStates:
    """What :func:`load_states` restored: ``reader`` (the folder's reader, to read the other files from, each
    once) and ``groups``: per optimizer loaded from a full file, ``(kept group indices or None, saved group
    count)``, which its LR scheduler's per-group state follows (an HF checkpoint keeps an empty group)."""

    reader: CheckpointReader
    groups: dict[int, tuple[list[int] | None, int]]


def require_model_entries(reader: CheckpointReader, shards: list[str]) -> None:
    """Refuse a manifest with a shard name that leaves the folder, or without model weights.

    Raises:
        CheckpointError: names the folder and what is missing.
    """
    path, files = reader.folder, reader.files
    for name in shards:
        check_entry_name(name, repr(path))
    if not shards and not any(n in files for n in (WEIGHTS_NAME, WEIGHTS_NAME_PT)) and not has_adapter_files(files):
        raise CheckpointError(f"{path!r} holds no model weights: its manifest lists neither {WEIGHTS_NAME} nor "
                              f"{WEIGHTS_NAME_PT} nor PEFT adapter weights nor shards/.")


def load_states(strategy: Any, folder: str, module: torch.nn.Module, optimizers: Sequence[Any] = (),
                reader: CheckpointReader | None = None) -> LoadedStates:
    """Restore ``module`` and ``optimizers`` from checkpoint ``folder`` (``Strategy.load_checkpoint`` calls this):
    the strategy's shards (:meth:`~taskfit.strategies.strategy.Strategy.load_checkpoint_shards`: model and first
    optimizer), else the full weights, then every optimizer not restored from shards from ``optimizer.pt`` /
    ``optimizer_{i}.pt`` (an empty group HF keeps is dropped). ``reader`` (default: :func:`open_checkpoint` with
    ``weights_only=True``) verifies every file against the manifest on the bytes that are loaded.

    Raises:
        CheckpointError: a missing, corrupted or unlisted file, or weights that do not match ``module``.
        UnsafeCheckpointError: a file needs full unpickling and the reader is ``weights_only``.
    """
    from taskfit.io.hf_checkpoint import drop_empty_groups

    reader = reader or open_checkpoint(strategy.checkpoint_io, folder)
    optimizers = list(optimizers)
    shards = shard_names(reader.manifest)
    require_model_entries(reader, shards)
    names = [] if shards else [optimizer_file(i) for i in range(len(optimizers))]
    require_entries(reader.manifest, folder, names, "the run has an optimizer to restore")
    # the strategy restores model and optimizer itself from its shards (or, FSDP, from full files it re-shards),
    # verifying each shard against the manifest as it reads it
    restored = strategy.load_checkpoint_shards(module, optimizers[0] if optimizers else None, folder, shards,
                                               reader=reader)
    if not restored:
        load_model_weights(strategy, module, folder, reader=reader)
    groups: dict[int, tuple[list[int] | None, int]] = {}
    for i, opt in enumerate(optimizers):
        name = optimizer_file(i)
        if name in reader.files and not (restored and i == 0):
            saved = reader.read(name)
            n_saved = len(saved.get("param_groups", ())) if isinstance(saved, dict) else 0
            saved, keep = drop_empty_groups(saved, len(opt.param_groups))  # HF keeps an empty group; taskfit not
            groups[i] = (keep, n_saved)
            opt.load_state_dict(saved)
    return LoadedStates(reader, groups)


#: HF's index of a weights file split into shards (``save_pretrained(max_shard_size=...)``, HF's checkpoints)
WEIGHTS_INDEX_NAMES = {WEIGHTS_NAME: "model.safetensors.index.json", WEIGHTS_NAME_PT: "pytorch_model.bin.index.json"}


def resharded_weights(reader: CheckpointReader, name: str) -> dict[str, torch.Tensor] | None:
    """The full state dict of a checkpoint whose listed weights file ``name`` was replaced by HF's index and
    shards (``model.safetensors.index.json`` + ``model-00001-of-0000N.safetensors``, as ``save_pretrained`` and
    ``transformers.Trainer`` write large models; HF ``load_sharded_checkpoint`` loads the same); None when
    ``name`` itself is there. The manifest's size and hash guarantees stay for every file it lists; the index
    and its shards are not in it, so only their names (inside the folder) and contents (every tensor the index
    maps, no other) are checked. ``name`` counts as verified afterwards.

    Raises:
        CheckpointError: an unreadable index, a shard name that leaves the folder, a missing shard, or shards
            whose tensors differ from the index's map (names the file).
    """
    from taskfit.io.checkpoint_io import deserialize

    io, folder = reader.io, reader.folder
    index = join(folder, WEIGHTS_INDEX_NAMES[name])
    if io.exists(join(folder, name)) or not io.exists(index):
        return None
    try:
        weight_map = json.loads(io.read_bytes(index))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index!r} is not a weights index (a JSON object with a 'weight_map'): {exc}") from None
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        check_entry_name(str(shard), repr(folder))
        try:
            data = io.read_bytes(join(folder, shard))
        except FileNotFoundError:
            raise CheckpointError(f"Weights shard {join(folder, shard)!r} (listed in {index!r}) is missing.") from None
        state.update(deserialize(join(folder, shard), data, map_location="cpu", weights_only=reader.weights_only))
    if set(state) != set(weight_map):
        raise CheckpointError(f"The shards of {index!r} hold other tensors than its weight_map lists: "
                              f"{sorted(set(state) ^ set(weight_map))[:5]}.")
    reader.verified.add(name)  # replaced by the shards, checked above: not a missing file at the end of a resume
    return state


def load_model_weights(strategy: Any, model: torch.nn.Module, path: str, manifest: dict[str, Any] | None = None,
                       weights_only: bool = True, reader: CheckpointReader | None = None) -> None:
    """Load the checkpoint's full weights into ``model`` (its exported part, see :func:`exportable_model`;
    strict: every key must match); a folder with PEFT adapter files instead loads them into a PEFT model
    (:func:`taskfit.io.peft_files.load_adapter_files`).

    Raises:
        CheckpointError: no weights file, keys that do not match the model, or adapter files for a model that is
            no PEFT model.
    """
    reader = reader or CheckpointReader(strategy.checkpoint_io, path, manifest, weights_only=weights_only)
    name = next((n for n in (WEIGHTS_NAME, WEIGHTS_NAME_PT) if n in reader.files), None)
    model = exportable_model(model)
    if name is None and has_adapter_files(reader.files):
        if not is_peft_model(model):
            raise CheckpointError(f"{path!r} holds PEFT adapter weights, not full weights; load it into the PEFT "
                                  f"model it was written from (peft.get_peft_model(base, config)), not into "
                                  f"{type(model).__name__}.")
        load_adapter_files(model, reader.files, reader.read, path)
        return
    if name is None:
        raise CheckpointError(f"{path!r} holds no model weights ({WEIGHTS_NAME} or {WEIGHTS_NAME_PT}).")
    state = resharded_weights(reader, name)
    if state is None:
        state = reader.read(name)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{join(path, name)!r} does not match {type(model).__name__}: missing keys "
                              f"{result.missing_keys[:5]}, unexpected keys {result.unexpected_keys[:5]}.")
