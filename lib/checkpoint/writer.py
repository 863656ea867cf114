"""Writing ``output_dir/checkpoint-{global_step}/`` and the final model of a running fit (F-CKPT-1, F-CKPT-3,
F-CKPT-4, F-CORE-7): which files a run contributes (model config, schedulers, training state, RNG, HF-interop files),
handed down to ``Strategy.save_checkpoint``, which adds the model and optimizer states and writes the folder
(:mod:`taskfit.strategies.checkpointing`). The format itself (layout, manifest, version,
verification, listing and rotation) lives in :mod:`taskfit.io.checkpoint_format`; its names are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from taskfit.__about__ import __version__
from taskfit.data.stateful import DATA_STATE_NAME
from taskfit.io.checkpoint_format import (  # noqa: F401  (re-exported: the format's public names)
    FORMAT, FORMAT_VERSION, MANIFEST_NAME, PREFIX, WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, CheckpointReader,
    ManifestWriter, hash_files_in_background, list_checkpoints, part_writer, read_file, read_manifest,
    rotate_checkpoints, synchronous_io,
)
from taskfit.io.checkpoint_io import join
from taskfit.loggers.logger import json_hparams
from taskfit.strategies.checkpointing import (  # noqa: F401  (exportable_model, states_on_cpu: re-exported)
    FolderPlan, exportable_model, manifest_header, states_on_cpu, weight_files,
)

if TYPE_CHECKING:
    from taskfit.protocols import FitView


def checkpoint_path(fit: FitView, step: int | None = None) -> str:
    """``output_dir/checkpoint-{global_step}``: where the checkpoint of ``step`` (default: now) goes."""
    return join(fit.args.output_dir, f"{PREFIX}{fit.state.global_step if step is None else step}")


def model_files(fit: FitView, weights: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """``{file name: object}`` of the model part of a checkpoint: weights (a PEFT model's adapters only, see
    :func:`~taskfit.strategies.checkpointing.weight_files`) and ``config.json``.

    ``weights`` (default: ``strategy.model_state_dict`` of the exported model, a collective for sharded
    strategies, so every rank must then call this) are the full state dict to write."""
    model = exportable_model(fit.model)
    name = WEIGHTS_NAME if fit.args.save_safetensors is not False else WEIGHTS_NAME_PT
    weights = fit.strategy.model_state_dict(model) if weights is None else weights
    return {**weight_files(model, weights, name), "config.json": model_config(model)}


def model_config(model: torch.nn.Module, datamodule: Any = None) -> Any:
    """What ``config.json`` holds for the exported ``model``: an HF model's own config (JSON text), else its class,
    parameter count, taskfit version and the hyperparameters ``load_from_checkpoint`` rebuilds it from (also the
    ``datamodule``'s, as ``datamodule_hyper_parameters``, for ``LightningDataModule.load_from_checkpoint``)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        if hasattr(model, "save_pretrained"):  # as save_pretrained records it: the class whose weights these are
            config.architectures = [type(model).__name__.removeprefix("FSDP")]
        return config.to_json_string()
    out = {"class": f"{type(model).__module__}.{type(model).__qualname__}",
           "num_parameters": sum(p.numel() for p in model.parameters()), "taskfit_version": __version__}
    hparams = json_hparams(model)  # a function, not the module's method: hook recorders see no extra call
    if hparams is not None:  # what load_from_checkpoint rebuilds the module from
        out["hyper_parameters"] = hparams
        if vars(model).get("_hparams_name"):  # saved from one config argument: rebuilt through that argument
            out["hparams_name"] = vars(model)["_hparams_name"]
    dm_hparams = json_hparams(datamodule) if datamodule is not None else None
    if dm_hparams:
        out["datamodule_hyper_parameters"] = dm_hparams
        if vars(datamodule).get("_hparams_name"):
            out["datamodule_hparams_name"] = vars(datamodule)["_hparams_name"]
    return out


def save_model_folder(fit: FitView, folder: str, weights: dict[str, torch.Tensor] | None = None,
                      merge_adapters: bool = False) -> None:
    """Write the unwrapped model's weights and config (and the processing class) into ``folder``.

    HF-style models (with ``save_pretrained``, also when a TaskModule only wraps one, see
    :func:`exportable_model`) are saved through it when ``folder`` is local, so ``from_pretrained`` reads them back;
    other modules, and every remote folder, get ``model.safetensors`` plus ``config.json``. A PEFT model writes its
    adapters, or with ``merge_adapters`` the full weights of a merged copy
    (:func:`~taskfit.io.peft_files.merged_copy`; raises ValueError for a model it cannot merge).
    """
    io = fit.strategy.checkpoint_io
    model = exportable_model(fit.model)
    weights = fit.strategy.model_state_dict(model) if weights is None else weights
    if merge_adapters:
        from taskfit.io.peft_files import merged_copy

        model = merged_copy(model, weights)
        weights = model.state_dict()
    if hasattr(model, "save_pretrained") and io.is_local(folder):
        model.save_pretrained(io.fs(folder)[1], state_dict=weights,
                              safe_serialization=fit.args.save_safetensors is not False)
    else:
        io.wait()  # written before returning, also with a background (async) plugin: callers read it right away
        name = WEIGHTS_NAME if fit.args.save_safetensors is not False else WEIGHTS_NAME_PT
        files = {**weight_files(model, weights, name), "config.json": model_config(model)}
        synchronous_io(io).save_files(files, folder)
    processor = _processor(fit)
    if processor is not None and io.is_local(folder):
        processor.save_pretrained(io.fs(folder)[1])


def _processor(fit: FitView) -> Any:
    """The processing class HF saves with the model (None when it has no ``save_pretrained``): ``processing_class``,
    else the collator's tokenizer (HF: ``DataCollatorWithPadding(tok)`` given without one)."""
    processor = fit.processing_class
    if processor is None:
        processor = getattr(getattr(fit, "data_collator", None), "tokenizer", None)
    return processor if hasattr(processor, "save_pretrained") else None


def saved_with_model_files(fit: FitView) -> dict[str, bytes]:
    """``{file name: bytes}`` HF writes into every checkpoint folder next to the weights and ``config.json``: a
    generative model's ``generation_config.json`` (``save_pretrained``) and the processing class's files
    (tokenizer files..., ``Trainer._save``); listed in the manifest like the other files. Empty for other models
    without a processing class."""
    import tempfile
    from pathlib import Path

    model = exportable_model(fit.model)
    generation = getattr(model, "generation_config", None)
    if not (generation is not None and callable(getattr(model, "can_generate", None)) and model.can_generate()):
        generation = None
    savers = [x for x in (generation, _processor(fit)) if x is not None]
    if not savers:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        for saver in savers:
            saver.save_pretrained(tmp)
        return {p.relative_to(tmp).as_posix(): p.read_bytes() for p in sorted(Path(tmp).rglob("*")) if p.is_file()}


def checkpoint_files(fit: FitView, training_state: dict[str, Any]) -> dict[str, Any]:
    """``{file name: object}`` this rank contributes to the checkpoint of the current step, besides the model and
    optimizer states (the strategy adds those: its shards, or the full weights and ``optimizer.pt``...).
    ``training_state`` is the run's :class:`~taskfit.loops.state.TrainingState` dict (its ``rng`` part goes into
    this rank's own file, its ``data`` part, a stateful iterable's position, into ``data_state_{rank}.json``).
    Schedulers after the first are ``scheduler_{i}.pt``."""
    a, strategy = fit.args, fit.strategy
    files: dict[str, Any] = {f"rng_state_{strategy.global_rank}.pt": training_state["rng"]}
    if training_state.get("data") is not None and not a.save_only_model:
        files[DATA_STATE_NAME.format(rank=strategy.global_rank)] = training_state["data"]
    if strategy.world_size == 1 and not a.save_only_model:  # transformers.Trainer resumes from this folder too
        from taskfit.io.hf_checkpoint import HF_RNG_NAME, hf_rng_file

        files[HF_RNG_NAME] = hf_rng_file(training_state["rng"], strategy.root_device.index)
    if not is_writer(fit):
        return files
    files.update(saved_with_model_files(fit))  # before config.json: a processor's own file never replaces it
    files["config.json"] = model_config(exportable_model(fit.model), getattr(fit, "datamodule", None))
    if not a.save_only_model:
        for i, cfg in enumerate(fit.lr_scheduler_configs):
            files["scheduler.pt" if i == 0 else f"scheduler_{i}.pt"] = cfg.scheduler.state_dict()
        files["training_state.pt"] = {**{k: v for k, v in training_state.items() if k not in ("rng", "data")},
                                      "taskfit_version": __version__}
    from taskfit.io.hf_checkpoint import hf_trainer_state

    # HF TrainerState's fields only, with HF's stateful_callbacks: transformers.Trainer resumes from it
    files["trainer_state.json"] = hf_trainer_state(fit.state.hf_dict(), fit.control, fit.callbacks)
    files["fit_args.json"] = a.to_json_string(redact=True)  # never write credentials
    return files


def _hf_groups(fit: FitView) -> list[tuple[int, float]]:
    """The empty groups to insert into ``optimizer.pt``/``scheduler.pt`` so that ``transformers.Trainer`` resumes
    from a one-process folder when it would have built the optimizer from the same arguments (it keeps an empty
    decay / no-decay group, taskfit drops it); taskfit's reader drops the empty group again
    (:mod:`taskfit.io.hf_checkpoint`)."""
    from taskfit.io.hf_checkpoint import hf_missing_groups
    from taskfit.optim.optimizers import get_decay_parameter_names

    if fit.strategy.world_size != 1 or fit.args.save_only_model or len(fit.optimizers) != 1:
        return []
    if getattr(fit, "_optimizers", (None, None))[0] is not None:  # Fit(optimizers=...): HF resumes it as it is
        return []
    return hf_missing_groups(fit.optimizers[0], fit.model, float(fit.args.weight_decay),
                             set(get_decay_parameter_names(fit.model)) if fit.model is not None else set())


def is_writer(fit: FitView) -> bool:
    """Whether this process writes the shared files and the manifest: global rank 0, or the first process of
    every node with ``save_on_each_node`` (mirrors HF ``TrainingArguments.should_save``)."""
    return fit.local_rank == 0 if fit.args.save_on_each_node else fit.is_global_zero


def save_checkpoint(fit: FitView, training_state: dict[str, Any], path: str | None = None) -> str:
    """Write ``output_dir/checkpoint-{global_step}/``: the files this run contributes (:func:`checkpoint_files`),
    handed to ``strategy.save_checkpoint`` with the model and optimizers (their shards or full states, the manifest
    last, through the strategy's checkpoint IO, so in the background with ``AsyncCheckpointIO``); old checkpoints
    are rotated per ``save_total_limit`` once it is complete. Every process must call it.

    Args:
        fit (FitView): the running fit (its current run's model, optimizers, schedulers and state).
        training_state (dict): the run's ``TrainingState.state_dict()`` (saved whole).
        path (str | None): another folder to write (``ModelCheckpoint``); the same format, no rotation.

    Returns:
        str: the checkpoint's final path (complete once its manifest exists).
    """
    a, strategy = fit.args, fit.strategy
    final = path or checkpoint_path(fit)
    keep = {fit.state.best_model_checkpoint} if (a.load_best_model_at_end or a.metric_for_best_model) else set()
    dp = strategy.data_parallel_size  # recorded under tensor parallelism only (fewer readers than processes)
    manifest = manifest_header(fit.state.global_step, strategy.world_size, bool(a.save_only_model),
                               dp if dp != strategy.world_size else None)
    plan = FolderPlan(manifest, is_writer(fit), _ranks_in_folder(fit), a.output_dir,
                      None if path else a.save_total_limit, keep, float(a.ddp_timeout or 1800),
                      WEIGHTS_NAME if a.save_safetensors is not False else WEIGHTS_NAME_PT, _hf_groups(fit))
    return strategy.save_checkpoint(final, checkpoint_files(fit, training_state), fit.model, fit.optimizers,
                                    plan=plan)


def _ranks_in_folder(fit: FitView) -> list[int]:
    strategy = fit.strategy
    if not fit.args.save_on_each_node or strategy.world_size == 1:
        return list(range(strategy.world_size))
    per_node = max(1, strategy.world_size // max(1, fit.args.num_nodes))
    first = strategy.global_rank - strategy.local_rank
    return list(range(first, first + per_node))
