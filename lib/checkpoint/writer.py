"""Writing ``output_dir/checkpoint-{global_step}/`` and the final model from a running ``Fit`` (F-CKPT-1, F-CKPT-3,
F-CKPT-4, F-CORE-7): which files a rank writes and in what order. The format itself (layout, manifest, version,
verification, listing and rotation) lives in :mod:`taskfit.io.checkpoint_format`; its names are re-exported here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from taskfit.__about__ import __version__
from taskfit.io.checkpoint_format import (  # noqa: F401  (re-exported: the format's public names)
    FORMAT, FORMAT_VERSION, MANIFEST_NAME, PREFIX, WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, CheckpointReader,
    ManifestWriter, hash_files_in_background, list_checkpoints, part_writer, read_file, read_manifest,
    rotate_checkpoints, synchronous_io,
)
from taskfit.io.checkpoint_io import join

if TYPE_CHECKING:
    from taskfit.fit.fit import Fit


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
        hparams = getattr(model, "hparams_for_checkpoint", None)
        if hparams is not None:  # what load_from_checkpoint rebuilds the module from
            files["config.json"]["hyper_parameters"] = hparams()
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
        io.wait()  # written before returning, also with a background (async) plugin: callers read it right away
        synchronous_io(io).save_files(model_files(fit, weights), folder)
    processor = fit.processing_class
    if processor is None:  # HF: the collator's tokenizer (DataCollatorWithPadding(tok) given without one)
        processor = getattr(getattr(fit, "data_collator", None), "tokenizer", None)
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
    if fit.world_size == 1 and not a.save_only_model:  # transformers.Trainer resumes from this folder too
        from taskfit.io.hf_checkpoint import HF_RNG_NAME, hf_rng_file

        files[HF_RNG_NAME] = hf_rng_file(training_state["rng"], fit.strategy.root_device.index)
    if not is_writer(fit):
        return files
    files.update({k: v for k, v in model_files(fit, weights or {}).items() if not sharded or k == "config.json"})
    if not a.save_only_model:
        if not sharded:
            for i, opt in enumerate(fit.optimizers):
                files["optimizer.pt" if i == 0 else f"optimizer_{i}.pt"] = states_on_cpu(fit.strategy, opt.state_dict())
        for i, cfg in enumerate(fit.lr_scheduler_configs):
            files["scheduler.pt" if i == 0 else f"scheduler_{i}.pt"] = cfg.scheduler.state_dict()
        if fit.world_size == 1 and "optimizer.pt" in files:
            _hf_groups(fit, files)
        files["training_state.pt"] = {**{k: v for k, v in training_state.items() if k != "rng"},
                                      "taskfit_version": __version__}
    from taskfit.io.hf_checkpoint import hf_trainer_state

    # HF TrainerState's fields only, with HF's stateful_callbacks: transformers.Trainer resumes from it
    files["trainer_state.json"] = hf_trainer_state(fit.state.hf_dict(), fit.control, fit.callbacks)
    files["fit_args.json"] = a.to_json_string(redact=True)  # never write credentials
    return files


def _hf_groups(fit: Fit, files: dict[str, Any]) -> None:
    """Write the optimizer and schedule in HF's two-group layout when ``transformers.Trainer`` would have built
    them from the same arguments (it keeps an empty decay / no-decay group, taskfit drops it), so HF resumes from the
    folder; taskfit's reader drops the empty group again (:mod:`taskfit.io.hf_checkpoint`)."""
    from taskfit.io.hf_checkpoint import hf_missing_groups, pad_groups
    from taskfit.optim.optimizers import get_decay_parameter_names

    if getattr(fit, "_optimizers", (None, None))[0] is not None or len(fit.optimizers) != 1:
        return  # the user's own optimizer: HF resumes it with the same groups
    missing = hf_missing_groups(fit.optimizers[0], fit.model, float(fit.args.weight_decay),
                                set(get_decay_parameter_names(fit.model)) if fit.model is not None else set())
    if missing:
        files["optimizer.pt"], sched = pad_groups(files["optimizer.pt"], files.get("scheduler.pt"), missing)
        if sched is not None:
            files["scheduler.pt"] = sched


def states_on_cpu(strategy: Any, state: Any) -> Any:
    """``state`` with device tensors (CUDA, XLA, MPS) moved to the CPU, so the file loads anywhere (``Fit``
    checkpoints and ``Engine.save``)."""
    if strategy.root_device.type == "cpu":
        return state
    from lightning_utilities.core.apply_func import apply_to_collection

    return apply_to_collection(state, torch.Tensor, lambda t: t.detach().cpu())


def is_writer(fit: Fit) -> bool:
    """Whether this process writes the shared files and the manifest: global rank 0, or the first process of
    every node with ``save_on_each_node`` (mirrors HF ``TrainingArguments.should_save``)."""
    return fit.local_rank == 0 if fit.args.save_on_each_node else fit.is_global_zero


def save_checkpoint(fit: Fit, training_state: dict[str, Any], path: str | None = None) -> str:
    """Write ``output_dir/checkpoint-{global_step}/`` (through the strategy's checkpoint IO, so in the background
    with ``AsyncCheckpointIO``); rotate old checkpoints per ``save_total_limit`` once it is complete.

    Args:
        fit (Fit): the running fit (its current run's model, optimizers, schedulers and state).
        training_state (dict): the run's ``TrainingState.state_dict()`` (saved whole).
        path (str | None): another folder to write (``ModelCheckpoint``); the same format, no rotation.

    Returns:
        str: the checkpoint's final path (complete once its manifest exists).
    """
    io, a = fit.strategy.checkpoint_io, fit.args
    final = path or checkpoint_path(fit)
    local = io.is_local(final)
    target = final + ".tmp" if local else final
    writer = is_writer(fit)
    if writer:
        io.wait()  # an earlier save of this same folder may still be in flight
        if local and os.path.islink(io.fs(final)[1]):
            io.remove_checkpoint(final)  # a link named like this checkpoint: drop the link, never its target
        io.remove_checkpoint(join(final, MANIFEST_NAME))  # re-saving a step: never leave an old manifest over new files
        io.remove_checkpoint(target)
    fit.strategy.barrier("checkpoint-prepare")
    ranks = _ranks_in_folder(fit)
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "global_step": fit.state.global_step,
                "world_size": fit.world_size, "save_only_model": bool(a.save_only_model),
                "taskfit_version": __version__, "torch_version": torch.__version__}
    if hasattr(fit.strategy, "data_parallel_size"):  # tensor parallelism: fewer readers than processes
        manifest["data_parallel_size"] = fit.strategy.data_parallel_size
    timeout = float(a.ddp_timeout or 1800)
    shards = None if a.save_only_model else fit.strategy.save_checkpoint_shards(fit.model, fit.optimizer, target)
    # the full weights are a collective for sharded strategies: every rank takes part (only the writer keeps them)
    weights = fit.strategy.model_state_dict(exportable_model(fit.model)) if shards is None else None
    # backend-written shards are hashed (and synced) on a background thread while the other files are written
    hashes = hash_files_in_background(io, target, list(shards)) if shards else None
    if writer:
        keep = {fit.state.best_model_checkpoint} if (a.load_best_model_at_end or a.metric_for_best_model) else set()
        finalize: Any = ManifestWriter(io, target, final, manifest, ranks, fit.global_rank, a.output_dir,
                                       None if path else a.save_total_limit, keep, timeout, hashes)
    else:
        finalize = part_writer(io, target, fit.global_rank, hashes, timeout)
    io.save_files(checkpoint_files(fit, training_state, weights), target, finalize)
    return final


def _ranks_in_folder(fit: Fit) -> list[int]:
    if not fit.args.save_on_each_node or fit.world_size == 1:
        return list(range(fit.world_size))
    per_node = max(1, fit.world_size // max(1, fit.args.num_nodes))
    first = fit.global_rank - fit.local_rank
    return list(range(first, first + per_node))
