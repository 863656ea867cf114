"""Writing ``output_dir/checkpoint-{global_step}/`` and the final model (F-CKPT-1, F-CKPT-3, F-CKPT-4, F-CORE-7).

Layout of a checkpoint folder (``output_dir`` may be a local path or any fsspec URL)::

    model.safetensors       model weights (pytorch_model.bin with save_safetensors=False); for HF-style models
    config.json             the model's config (HF models: their own config.json, so from_pretrained reads it)
    optimizer.pt            optimizer state dict               (not with save_only_model)
    scheduler.pt            LR scheduler state dict            (not with save_only_model; absent without one)
    training_state.pt       the run's training state (versioned): loop state, control flags, precision plugin
                            (grad scaler), callback states, self.log aggregates and every rank's running loss
                            sum                                 (not with save_only_model)
    rng_state_{rank}.pt     python / numpy / torch / accelerator RNG states, one file per rank
    trainer_state.json      the loop state as readable JSON (HF's trainer_state.json)
    fit_args.json           the FitArguments of the run
    manifest.json           written LAST: every file with its size (bytes) and SHA-256

A checkpoint is complete exactly when its ``manifest.json`` exists. On the local disk the folder is assembled as
``checkpoint-N.tmp`` and renamed into place after the manifest is written; on object stores (no atomic rename)
the files are written in place and the manifest last. Resume only considers complete checkpoints, so a process
killed during a save leaves nothing that resume would pick. With several processes every rank writes its own
files plus a ``.part-{rank}.json`` list; the writing rank waits for all parts before the manifest.
Sharded strategies add their own per-rank files through the same mechanism (the manifest lists any files).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from taskfit.__about__ import __version__
from taskfit.io.checkpoint_io import CheckpointIO, FileEntry, deserialize, join

if TYPE_CHECKING:
    from taskfit.fit import Fit

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME_PT = "pytorch_model.bin"
MANIFEST_NAME = "manifest.json"
PREFIX = "checkpoint-"
FORMAT = "taskfit-checkpoint"
FORMAT_VERSION = 1
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint cannot be used: missing, incomplete, corrupted (checksum mismatch) or incompatible."""


def checkpoint_path(fit: Fit, step: int | None = None) -> str:
    """``output_dir/checkpoint-{global_step}``: where the checkpoint of ``step`` (default: now) goes."""
    return join(fit.args.output_dir, f"{PREFIX}{fit.state.global_step if step is None else step}")


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


def model_files(fit: Fit, weights: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """``{file name: object}`` of the model part of a checkpoint: weights and ``config.json``.

    ``weights`` (default: ``strategy.model_state_dict`` of the exported model, a collective for sharded
    strategies, so every rank must then call this) are the full state dict to write."""
    model = exportable_model(fit.model)
    name = WEIGHTS_NAME if fit.args.save_safetensors is not False else WEIGHTS_NAME_PT
    files: dict[str, Any] = {name: fit.strategy.model_state_dict(model) if weights is None else weights}
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        files["config.json"] = config.to_json_string()
    else:
        files["config.json"] = {"class": f"{type(model).__module__}.{type(model).__qualname__}",
                                "num_parameters": sum(p.numel() for p in model.parameters()),
                                "taskfit_version": __version__}
    return files


def save_model_folder(fit: Fit, folder: str, weights: dict[str, torch.Tensor] | None = None) -> None:
    """Write the unwrapped model's weights and config (and the processing class) into ``folder``.

    HF-style models (with ``save_pretrained``, also when a TaskModule only wraps one, see
    :func:`exportable_model`) are saved through it when ``folder`` is local, so ``from_pretrained`` reads them back;
    other modules, and every remote folder, get ``model.safetensors`` plus ``config.json``.
    """
    io = fit.strategy.checkpoint_io
    model = exportable_model(fit.model)
    weights = fit.strategy.model_state_dict(model) if weights is None else weights
    if hasattr(model, "save_pretrained") and io.is_local(folder):
        model.save_pretrained(io.fs(folder)[1], state_dict=weights,
                              safe_serialization=fit.args.save_safetensors is not False)
    else:
        io.wait()
        io.save_files(model_files(fit, weights), folder)
    processor = fit.processing_class
    if processor is not None and hasattr(processor, "save_pretrained") and io.is_local(folder):
        processor.save_pretrained(io.fs(folder)[1])


def checkpoint_files(fit: Fit, training_state: dict[str, Any],
                     weights: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """``{file name: object}`` this rank writes into the checkpoint of the current step. ``training_state`` is the
    run's :class:`~taskfit.loops.state.TrainingState` dict (its ``rng`` part goes into this rank's own file).
    ``weights`` is the full model state dict, or None when the strategy wrote the model and optimizer shards itself
    (then only ``config.json`` of the model part is written here). Optimizers and schedulers after the first are
    ``optimizer_{i}.pt`` / ``scheduler_{i}.pt``."""
    a, rank = fit.args, fit.global_rank
    sharded = weights is None
    files: dict[str, Any] = {f"rng_state_{rank}.pt": training_state["rng"]}
    if not is_writer(fit):
        return files
    files.update({k: v for k, v in model_files(fit, weights or {}).items() if not sharded or k == "config.json"})
    if not a.save_only_model:
        if not sharded:
            for i, opt in enumerate(fit.optimizers):
                files["optimizer.pt" if i == 0 else f"optimizer_{i}.pt"] = _on_cpu(fit, opt.state_dict())
        for i, cfg in enumerate(fit.lr_scheduler_configs):
            files["scheduler.pt" if i == 0 else f"scheduler_{i}.pt"] = cfg.scheduler.state_dict()
        files["training_state.pt"] = {**{k: v for k, v in training_state.items() if k != "rng"},
                                      "taskfit_version": __version__}
    files["trainer_state.json"] = fit.state.hf_dict()  # HF TrainerState's fields only: HF reads it
    files["fit_args.json"] = a.to_json_string(redact=True)  # never write credentials
    return files


def _on_cpu(fit: Fit, state: Any) -> Any:
    """``state`` with device tensors (CUDA, XLA, MPS) moved to the CPU, so the file loads anywhere."""
    if fit.strategy.root_device.type == "cpu":
        return state
    from lightning_utilities.core.apply_func import apply_to_collection

    return apply_to_collection(state, torch.Tensor, lambda t: t.detach().cpu())


def is_writer(fit: Fit) -> bool:
    """Whether this process writes the shared files and the manifest: global rank 0, or the first process of
    every node with ``save_on_each_node`` (mirrors HF ``TrainingArguments.should_save``)."""
    return fit.local_rank == 0 if fit.args.save_on_each_node else fit.is_global_zero


def save_checkpoint(fit: Fit, training_state: dict[str, Any]) -> str:
    """Write ``output_dir/checkpoint-{global_step}/`` (through the strategy's checkpoint IO, so in the background
    with ``AsyncCheckpointIO``); rotate old checkpoints per ``save_total_limit`` once it is complete.

    Args:
        fit (Fit): the running fit (its current run's model, optimizers, schedulers and state).
        training_state (dict): the run's ``TrainingState.state_dict()`` (saved whole).

    Returns:
        str: the checkpoint's final path (complete once its manifest exists).
    """
    io, a = fit.strategy.checkpoint_io, fit.args
    final = checkpoint_path(fit)
    local = io.is_local(final)
    target = final + ".tmp" if local else final
    writer = is_writer(fit)
    if writer:
        io.wait()  # an earlier save of this same folder may still be in flight
        io.remove_checkpoint(join(final, MANIFEST_NAME))  # re-saving a step: never leave an old manifest over new files
        io.remove_checkpoint(target)
    fit.strategy.barrier("checkpoint-prepare")
    ranks = _ranks_in_folder(fit)
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "global_step": fit.state.global_step,
                "world_size": fit.world_size, "save_only_model": bool(a.save_only_model),
                "taskfit_version": __version__, "torch_version": torch.__version__}
    if writer:
        keep = {fit.state.best_model_checkpoint} if (a.load_best_model_at_end or a.metric_for_best_model) else set()
        finalize: Callable[[dict[str, FileEntry]], None] = _Finalizer(
            io, target, final, manifest, ranks, fit.global_rank, a.output_dir, a.save_total_limit, keep,
            float(a.ddp_timeout or 1800))
    else:
        part = join(target, f".part-{fit.global_rank}.json")
        def finalize(entries: dict[str, FileEntry]) -> None:
            io.write_bytes(part, json.dumps(entries).encode())
    shards = None if a.save_only_model else fit.strategy.save_checkpoint_shards(fit.model, fit.optimizer, target)
    # the full weights are a collective for sharded strategies: every rank takes part (only the writer keeps them)
    weights = fit.strategy.model_state_dict(exportable_model(fit.model)) if shards is None else None
    if shards:  # sharded strategies write their own files (DCP, DeepSpeed engine): add them to the manifest
        from taskfit.io.checkpoint_io import file_entry

        extra = {n: file_entry(io.read_bytes(join(target, n))) for n in shards}
        inner = finalize
        def finalize(entries: dict[str, FileEntry]) -> None:  # noqa: F811
            inner({**entries, **extra})
    io.save_files(checkpoint_files(fit, training_state, weights), target, finalize)
    return final


def _ranks_in_folder(fit: Fit) -> list[int]:
    if not fit.args.save_on_each_node or fit.world_size == 1:
        return list(range(fit.world_size))
    per_node = max(1, fit.world_size // max(1, fit.args.num_nodes))
    first = fit.global_rank - fit.local_rank
    return list(range(first, first + per_node))


class _Finalizer:
    """Runs after the writing rank's files are written (on the background thread for async saves): waits for
    the other ranks' parts, writes the manifest, renames the folder into place, rotates old checkpoints."""

    def __init__(self, io: CheckpointIO, target: str, final: str, manifest: dict, ranks: list[int], rank: int,
                 output_dir: str, limit: int | None, keep: set[str | None], timeout: float) -> None:
        self.io, self.target, self.final, self.manifest = io, target, final, manifest
        self.ranks, self.rank, self.output_dir, self.limit = ranks, rank, output_dir, limit
        self.keep, self.timeout = keep, timeout

    def __call__(self, entries: dict[str, FileEntry]) -> None:
        io, files = self.io, dict(entries)
        deadline = time.monotonic() + self.timeout
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
        io.write_bytes(join(self.target, MANIFEST_NAME), json.dumps(manifest, indent=2).encode())
        if self.target != self.final:
            io.rename(self.target, self.final)
        if self.limit:
            rotate_checkpoints(io, self.output_dir, self.limit, keep=self.keep | {self.final})


def list_checkpoints(io: CheckpointIO, output_dir: str, complete_only: bool = True) -> list[tuple[int, str]]:
    """``[(global_step, path)]`` of the checkpoints in ``output_dir``, oldest first; with ``complete_only``
    (default) only those whose manifest exists."""
    out = []
    for name in io.listdir(output_dir):
        m = _CHECKPOINT_RE.match(name)
        if m:
            path = join(output_dir, name)
            if not complete_only or io.exists(join(path, MANIFEST_NAME)):
                out.append((int(m.group(1)), path))
    return sorted(out)


def rotate_checkpoints(io: CheckpointIO, output_dir: str, limit: int, keep: set[str | None]) -> list[str]:
    """Delete the oldest complete checkpoints until at most ``limit`` remain, never one in ``keep`` (the newest and
    the best); mirrors HF ``save_total_limit`` (which keeps the best one too). Returns the deleted paths."""
    ckpts = [p for _, p in list_checkpoints(io, output_dir)]
    norm = {str(k).rstrip("/") for k in keep if k}
    removable = [p for p in ckpts if p.rstrip("/") not in norm]
    excess = len(ckpts) - max(int(limit), len([p for p in ckpts if p.rstrip("/") in norm]))
    deleted = []
    for p in removable[:max(0, excess)]:
        io.remove_checkpoint(join(p, MANIFEST_NAME))  # incomplete first, so a crash mid-delete is never picked
        io.remove_checkpoint(p)
        deleted.append(p)
    return deleted


def read_manifest(io: CheckpointIO, folder: str) -> dict[str, Any]:
    """The manifest of ``folder``.

    Raises:
        CheckpointError: no manifest (an incomplete checkpoint, or not a checkpoint folder) or an unreadable one.
    """
    try:
        manifest = json.loads(io.read_bytes(join(folder, MANIFEST_NAME)))
    except FileNotFoundError:
        raise CheckpointError(f"{folder!r} is not a complete checkpoint: it has no {MANIFEST_NAME} (the save was "
                              "interrupted, or this is not a taskfit checkpoint folder).") from None
    except ValueError as exc:
        raise CheckpointError(f"{join(folder, MANIFEST_NAME)!r} is not valid JSON: {exc}") from None
    if manifest.get("format") != FORMAT or "files" not in manifest:
        raise CheckpointError(f"{join(folder, MANIFEST_NAME)!r} is not a taskfit checkpoint manifest.")
    return manifest


def read_file(io: CheckpointIO, folder: str, name: str, manifest: dict[str, Any], weights_only: bool = True,
              map_location: Any = "cpu") -> Any:
    """Read, verify (size and SHA-256 against ``manifest``) and deserialise ``folder/name``.

    Raises:
        CheckpointError: the file is not in the manifest, missing, truncated or corrupted (names the file).
        UnsafeCheckpointError: it needs full unpickling and ``weights_only`` is True.
    """
    from taskfit.io.checkpoint_io import file_entry

    path = join(folder, name)
    expected = manifest["files"].get(name)
    if expected is None:
        raise CheckpointError(f"{path!r} is not listed in the checkpoint's manifest.")
    try:
        data = io.read_bytes(path)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path!r} is missing (listed in the manifest).") from None
    got = file_entry(data)
    if got != expected:
        what = "truncated" if got["size"] < expected["size"] else "corrupted"
        raise CheckpointError(f"Checkpoint file {path!r} is {what}: {got['size']} bytes with SHA-256 "
                              f"{got['sha256'][:12]}..., the manifest says {expected['size']} bytes with "
                              f"{expected['sha256'][:12]}...")
    return deserialize(name, data, map_location=map_location, weights_only=weights_only)
