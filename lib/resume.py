"""Resuming a run from a checkpoint and loading the best model at the end (F-CKPT-2, F-CKPT-3, F-LOOP-6).

``Fit.fit(resume_from_checkpoint=...)`` resolves the checkpoint (True / ``"last"``: the newest complete one in
``output_dir``; a path or URL: that one), checks that it can continue the run exactly, and restores the model,
optimizer, LR scheduler, precision plugin (grad scaler), loop state, control flags, callback states, the loop's
running loss sums and ``self.log`` epoch aggregates. The RNG states and the position in the epoch are handed to
the fit loop, which restores the RNG at the exact point the saved run was at and continues at the next unseen
batch through the sampler (mirrors HF ``skip_first_batches``), not by replaying batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskfit.checkpoint import exportable_model
from taskfit.io.checkpoint_format import (
    MANIFEST_NAME, WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, CheckpointReader, list_checkpoints,
    read_manifest, require_entries, shard_names,
)
from taskfit.io.checkpoint_io import join

if TYPE_CHECKING:
    from taskfit.fit import Fit

log = logging.getLogger("taskfit")


@dataclass
class ResumePoint:
    """What the fit loop needs to continue a restored run.

    Attributes:
        path (str): the checkpoint folder.
        skip_batches (int): micro-batches of the current epoch already consumed (0 at an epoch boundary or with
            ``ignore_data_skip``).
        rng (dict | None): this rank's RNG states at the time of the save.
        loop (dict): the fit loop's running sums (``tr_loss``, ``steps_since_log``, ``total_loss``, ``grad_norm``).
    """

    path: str
    skip_batches: int = 0
    rng: dict[str, Any] | None = None
    loop: dict[str, Any] = field(default_factory=dict)


def resolve_checkpoint(fit: Fit, value: str | bool | None) -> str | None:
    """The checkpoint folder ``resume_from_checkpoint=value`` names, or None to start fresh.

    ``True`` and ``"last"`` pick the newest complete checkpoint in ``output_dir`` (incomplete ones are skipped
    with a warning); when there is none, training starts from scratch with a warning (Lightning's ``ckpt_path=
    "last"`` rule), so a restart loop after a crash needs no special first run.

    Raises:
        CheckpointError: a given path that is not a complete checkpoint.
    """
    if value in (None, False, ""):
        return None
    io, out = fit.strategy.checkpoint_io, fit.args.output_dir
    if value is True or value == "last":
        done = list_checkpoints(io, out)
        partial = sorted(set(p for _, p in list_checkpoints(io, out, complete_only=False)) - set(p for _, p in done))
        if partial:
            log.warning("Ignoring incomplete checkpoints (no %s): %s", MANIFEST_NAME, ", ".join(partial))
        if not done:
            log.warning("resume_from_checkpoint=%r: no complete checkpoint in %s; training from scratch.", value, out)
            return None
        return done[-1][1]
    read_manifest(io, str(value))  # raises for a folder (or file) that is not a complete checkpoint
    return str(value)


def restore(fit: Fit, path: str, weights_only: bool = True) -> ResumePoint:
    """Load the checkpoint at ``path`` into ``fit`` (already set up with its optimizer and scheduler) and return
    where the loop continues.

    Raises:
        CheckpointError: missing/corrupted files (naming the file), a ``save_only_model`` checkpoint, or a
            batch-size / world-size / dataset change that would put a mid-epoch resume at the wrong sample.
        UnsafeCheckpointError: a file needs full unpickling and ``weights_only`` is True.
    """
    io = fit.strategy.checkpoint_io
    # every file below is read once: verified and loaded from the same bytes
    reader = CheckpointReader(io, path, weights_only=weights_only)
    manifest = reader.manifest
    if manifest.get("save_only_model"):
        raise CheckpointError(f"{path!r} was saved with save_only_model=True: it holds the weights but no optimizer, "
                              "scheduler, RNG or loop state, so training cannot continue exactly from it. Load the "
                              "weights into the model instead, or resume from a full checkpoint.")
    shards = shard_names(manifest)
    _require_entries(fit, reader, shards)

    def read(name: str) -> Any:
        return reader.read(name)

    saved_args = read("fit_args.json")
    ts = read("training_state.pt")
    if not isinstance(ts, dict) or not {"state", "control", "precision"} <= set(ts):
        raise CheckpointError(f"{path!r}: training_state.pt does not hold the training state (keys state, control, "
                              "precision).")
    point = ResumePoint(path, loop=ts.get("loop", {}))
    if point.loop.get("epoch_done"):  # saved after the end of an epoch: continue at the start of the next
        ts["state"]["current_epoch"] += 1
        ts["state"]["batch_in_epoch"] = 0
    _check_compatible(fit, saved_args, ts["state"], manifest)

    # the strategy restores model and optimizer itself from its shards (or, FSDP, from full files it re-shards),
    # verifying each shard against the manifest as it reads it
    restored = fit.strategy.load_checkpoint_shards(fit.model, fit.optimizer, path, shards, reader=reader)
    if not restored:
        load_model_weights(fit, path, manifest, weights_only, reader=reader)
    if fit.optimizer is not None and "optimizer.pt" in manifest["files"] and not restored:
        fit.optimizer.load_state_dict(read("optimizer.pt"))
    if fit.lr_scheduler is not None and "scheduler.pt" in manifest["files"]:
        fit.lr_scheduler.load_state_dict(read("scheduler.pt"))
    fit.strategy.precision.load_state_dict(ts["precision"])
    keep = {k: getattr(fit.state, k) for k in ("is_local_process_zero", "is_world_process_zero",
                                                "max_steps", "num_train_epochs", "logging_steps", "eval_steps",
                                                "save_steps", "train_batch_size")}
    fit.state.load_state_dict(ts["state"])
    for k, v in keep.items():
        setattr(fit.state, k, v)
    fit.control.load_state_dict(ts["control"])
    fit.control._new_step()
    _restore_callbacks(fit, ts.get("callbacks", {}))
    if ts.get("results") and fit.module._results is not None:
        fit.module._results.load_state_dict(ts["results"])
    fit._hooks.call("on_load_checkpoint", fit, fit.module, ts)

    rng_name = f"rng_state_{fit.global_rank}.pt"
    if rng_name in manifest["files"]:
        point.rng = read(rng_name)
    else:
        log.warning("%s has no RNG state for rank %d (saved with world_size=%s); RNG streams restart from the seed.",
                    path, fit.global_rank, manifest.get("world_size"))
    if fit.args.ignore_data_skip:
        fit.state.batch_in_epoch = 0  # HF: restart the current epoch from its first batch
    point.skip_batches = fit.state.batch_in_epoch
    log.info("Resuming from %s: epoch %d, global_step %d, %d micro-batches into the epoch.", path,
             fit.state.current_epoch, fit.state.global_step, point.skip_batches)
    return point


def _require_entries(fit: Fit, reader: CheckpointReader, shards: list[str]) -> None:
    """Refuse a manifest that lacks a file this run needs to continue exactly (instead of silently starting with
    a fresh optimizer or schedule)."""
    from taskfit.io.checkpoint_format import check_entry_name

    path, files = reader.folder, reader.files
    for name in shards:
        check_entry_name(name, repr(path))
    require_entries(reader.manifest, path, ["fit_args.json", "training_state.pt"], "every full checkpoint has it")
    if not shards and not any(n in files for n in (WEIGHTS_NAME, WEIGHTS_NAME_PT)):
        raise CheckpointError(f"{path!r} holds no model weights: its manifest lists neither {WEIGHTS_NAME} nor "
                              f"{WEIGHTS_NAME_PT} nor shards/.")
    if fit.optimizer is not None and not shards:
        require_entries(reader.manifest, path, ["optimizer.pt"], "the run has an optimizer to restore")
    if fit.lr_scheduler is not None:
        require_entries(reader.manifest, path, ["scheduler.pt"], "the run has an LR scheduler to restore")


def load_model_weights(fit: Fit, path: str, manifest: dict[str, Any] | None = None,
                       weights_only: bool = True, reader: CheckpointReader | None = None) -> None:
    """Load the checkpoint's weights into ``fit.model`` (strict: every key must match).

    Raises:
        CheckpointError: no weights file, or keys that do not match the model.
    """
    reader = reader or CheckpointReader(fit.strategy.checkpoint_io, path, manifest, weights_only=weights_only)
    name = next((n for n in (WEIGHTS_NAME, WEIGHTS_NAME_PT) if n in reader.files), None)
    if name is None:
        raise CheckpointError(f"{path!r} holds no model weights ({WEIGHTS_NAME} or {WEIGHTS_NAME_PT}).")
    state = reader.read(name)
    model = exportable_model(fit.model)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{join(path, name)!r} does not match {type(model).__name__}: missing keys "
                              f"{result.missing_keys[:5]}, unexpected keys {result.unexpected_keys[:5]}.")


def _check_compatible(fit: Fit, saved: dict[str, Any], state: dict[str, Any], manifest: dict[str, Any]) -> None:
    a = fit.args
    mid_epoch = state.get("batch_in_epoch", 0) > 0 and not a.ignore_data_skip
    changes = []
    for name, now in (("per_device_train_batch_size", a.per_device_train_batch_size),
                      ("world_size", fit.world_size)):
        before = manifest.get("world_size") if name == "world_size" else saved.get(name)
        if before is not None and before != now:
            changes.append(f"{name} {before} -> {now}")
    n_batches = _batches_per_epoch(fit)
    before_batches = state.get("batches_per_epoch")
    if before_batches is not None and n_batches is not None and before_batches != n_batches:
        changes.append(f"batches per epoch {before_batches} -> {n_batches} (the dataset or drop_last changed?)")
    if changes and mid_epoch:
        raise CheckpointError(
            f"Cannot continue mid-epoch from {manifest.get('global_step')!r}: the checkpoint was taken "
            f"{state['batch_in_epoch']} micro-batches into epoch {state.get('current_epoch')}, and "
            f"{'; '.join(changes)} would put the run at the wrong sample. Resume with the original settings, or "
            "pass ignore_data_skip=True to restart that epoch from its first batch.")
    accum_before = saved.get("gradient_accumulation_steps")
    if accum_before is not None and accum_before != a.gradient_accumulation_steps:
        changes.append(f"gradient_accumulation_steps {accum_before} -> {a.gradient_accumulation_steps}")
    if changes:
        log.warning("Resuming with changed settings (%s): the run continues from the checkpoint's position but "
                    "will not match an uninterrupted run with the original settings.", "; ".join(changes))


def _batches_per_epoch(fit: Fit) -> int | None:
    try:
        return len(fit.train_loader)
    except TypeError:
        return None


def _restore_callbacks(fit: Fit, states: dict[str, Any]) -> None:
    """taskfit/Lightning callbacks (``load_state_dict``) are always restored, as Lightning does; HF callbacks
    (``ExportableState``: ``state()`` with ``args``/``attributes``) only with
    ``restore_callback_states_from_checkpoint=True``, as HF does."""
    for cb in fit.callbacks:
        if hasattr(cb, "load_state_dict"):
            key = getattr(cb, "state_key", type(cb).__qualname__)
            if key in states:
                cb.load_state_dict(states[key])
        elif fit.args.restore_callback_states_from_checkpoint and hasattr(cb, "state"):
            saved = states.get(type(cb).__qualname__)
            if saved:
                for k, v in saved.get("attributes", {}).items():
                    setattr(cb, k, v)


def load_best_model(fit: Fit) -> dict[str, Any]:
    """``load_best_model_at_end``: load the weights of ``state.best_model_checkpoint`` into the model; returns
    ``{"best_global_step", "best_metric", "best_model_checkpoint"}`` for the train metrics (empty when no best
    checkpoint was recorded)."""
    st = fit.state
    if not st.best_model_checkpoint:
        log.warning("load_best_model_at_end=True but no best checkpoint was recorded (no evaluation with a save).")
        return {}
    io = fit.strategy.checkpoint_io
    io.wait()
    reader = CheckpointReader(io, st.best_model_checkpoint)
    shards = shard_names(reader.manifest)
    # sharded strategies restore their own shards (or cut full weights into shards); others load the full file
    if not fit.strategy.load_checkpoint_shards(fit.model, None, st.best_model_checkpoint, shards, reader=reader):
        load_model_weights(fit, st.best_model_checkpoint, reader=reader)
    log.info("Loaded the best model from %s (global_step %s, %s=%s).", st.best_model_checkpoint,
             st.best_global_step, fit.args.metric_for_best_model, st.best_metric)
    return {"best_global_step": st.best_global_step, "best_metric": st.best_metric,
            "best_model_checkpoint": st.best_model_checkpoint}


def finish_checkpoints(fit: Fit, metrics: dict[str, Any], publisher: Any = None) -> dict[str, Any]:
    """End of ``fit``: wait for a background save (raising its failure), load the best model
    (``load_best_model_at_end``), publish the final model (``push_to_hub``) and wait for every push. Returns the
    metrics to add: the best checkpoint's step/metric/path and ``push_errors`` (failed pushes, never raised).

    Raises:
        CheckpointSaveError: a background checkpoint save failed.
    """
    fit.strategy.checkpoint_io.wait()
    out: dict[str, Any] = {}
    if fit.args.load_best_model_at_end:
        out.update(load_best_model(fit))
    weights = None
    if fit.args.push_to_hub:  # the full weights may be a gather: every rank takes part, rank 0 publishes
        from taskfit.checkpoint import exportable_model
        from taskfit.publish import push_final

        weights = fit.strategy.model_state_dict(exportable_model(fit.model))
    if publisher is not None:
        push_final(fit, publisher, {**metrics, **out}, weights=weights)
        errors = publisher.finish()
        if errors:
            out["push_errors"] = len(errors)
    return out


def wait_for_saves_quietly(fit: Fit) -> None:
    """On a failing run: let a background checkpoint save finish (so it is not lost), logging its own failure
    instead of masking the run's exception."""
    try:
        fit.strategy.checkpoint_io.wait()
    except Exception:
        log.exception("A background checkpoint save failed while the run was failing.")
