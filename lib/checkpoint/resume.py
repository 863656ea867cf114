"""Resuming a run from a checkpoint and loading the best model at the end (F-CKPT-2, F-CKPT-3, F-LOOP-6).

``Fit.fit(resume_from_checkpoint=...)`` resolves the checkpoint (True / ``"last"`` / ``"auto"``: the newest
complete one in ``output_dir``; nothing given under an elastic launcher's restart: ``"auto"``; a path or URL:
that one), checks that it can continue the run exactly, and restores the model, optimizer, LR scheduler,
precision plugin (grad scaler), loop state, control flags, callback states, the loop's running loss sums and
``self.log`` epoch aggregates. The RNG states and the position in the epoch are handed to the fit loop, which
restores the RNG at the exact point the saved run was at and continues at the next unseen batch through the
sampler (mirrors HF ``skip_first_batches``), not by replaying batches; a stateful iterable (its own
``state_dict``/``load_state_dict``, see :mod:`taskfit.data.stateful`) continues from its saved per-rank state.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from taskfit.data.stateful import DATA_STATE_NAME
from taskfit.io.checkpoint_format import (
    MANIFEST_NAME, SHARDS_PREFIX, CheckpointError, CheckpointReader, list_checkpoints, read_manifest,
    require_entries, shard_names,
)
from taskfit.io.hf_checkpoint import (
    HF_FORMAT, HF_RNG_NAME, adopt_message, is_hf_checkpoint, numpy_rng_globals, place_hf_position,
    select_scheduler_groups,
)
from taskfit.loops.state import upgrade_training_state
from taskfit.strategies.checkpointing import (  # noqa: F401  (load_model_weights, open_checkpoint: re-exported)
    load_model_weights, open_checkpoint, require_model_entries,
)

if TYPE_CHECKING:
    from taskfit.protocols import FitView, RunView

log = logging.getLogger("taskfit")


def resolve_checkpoint(io: Any, output_dir: str, value: str | bool | None) -> str | None:
    """The checkpoint folder ``resume_from_checkpoint=value`` names, or None to start fresh.

    ``True``, ``"last"`` and ``"auto"`` pick the newest complete checkpoint in ``output_dir`` (incomplete ones are
    skipped with a warning; a folder ``transformers.Trainer`` wrote counts as complete, see
    :mod:`taskfit.io.hf_checkpoint`); when there is none, training starts from scratch (Lightning's ``ckpt_path=
    "last"`` rule; a warning for ``True``/``"last"``, an info line for ``"auto"``, which expects a first start), so
    a restart loop after a crash needs no special first run. ``None`` (the user passed nothing) means ``"auto"``
    when an elastic launcher restarted this process (``TORCHELASTIC_RESTART_COUNT`` > 0 under ``torchrun
    --max-restarts``, ``SLURM_RESTART_COUNT`` > 0 on a requeued SLURM job), else a fresh start; ``False`` always
    starts fresh.

    Raises:
        CheckpointError: a given path that is not a complete checkpoint (a ``ValueError`` starting with HF's
            ``"Can't find a valid checkpoint at {path}"``, then the reason).
    """
    if value is None:
        from taskfit.strategies.environments import elastic_restart

        restart = elastic_restart()
        if restart is None:
            return None
        found = _newest_complete(io, output_dir, "auto")
        log.warning("Elastic restart detected (%s): resume_from_checkpoint was not set, so the run %s.",
                    restart.describe(), f"continues from {found}" if found else
                    f"starts from scratch (no complete checkpoint in {output_dir})")
        return found
    if value in (False, ""):
        return None
    if value is True or value in ("last", "auto"):
        return _newest_complete(io, output_dir, value)
    if not is_hf_checkpoint(io, str(value)):
        try:
            read_manifest(io, str(value))  # raises for a folder (or file) that is not a complete checkpoint
        except CheckpointError as err:  # HF's words first (scripts match on them), then why
            raise CheckpointError(f"Can't find a valid checkpoint at {value}: {err}") from None
    return str(value)


def newest_checkpoint(io: Any, output_dir: str) -> str | None:
    """The newest complete ``checkpoint-N`` folder in ``output_dir`` (a folder ``transformers.Trainer`` wrote counts
    as complete; incomplete ones are skipped with a warning naming them), or None when there is none (mirrors
    ``transformers.trainer_utils.get_last_checkpoint``, which skips nothing).

    Args:
        io (CheckpointIO): the strategy's checkpoint IO (local or fsspec paths).
        output_dir (str): the run's output folder.
    """
    done = list_checkpoints(io, output_dir)
    others = [(s, p) for s, p in list_checkpoints(io, output_dir, complete_only=False) if (s, p) not in done]
    done = sorted(done + [(s, p) for s, p in others if is_hf_checkpoint(io, p)])
    partial = sorted(set(p for _, p in others) - set(p for _, p in done))
    if partial:
        log.warning("Ignoring incomplete checkpoints (no %s): %s", MANIFEST_NAME, ", ".join(partial))
    return done[-1][1] if done else None


def _newest_complete(io: Any, out: str, value: str | bool) -> str | None:
    """:func:`newest_checkpoint`, saying when there is none that training starts from scratch."""
    found = newest_checkpoint(io, out)
    if found is None:
        (log.info if value == "auto" else log.warning)(
            "resume_from_checkpoint=%r: no complete checkpoint in %s; training from scratch.", value, out)
    return found


def restore(run: RunView, path: str, strategy: Any, args: Any, weights_only: bool = True,
            reader: CheckpointReader | None = None, callbacks_restored: bool = False) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``run`` (already set up: the strategy returned its optimizers and
    schedulers): model and optimizers through ``strategy.load_checkpoint``, the schedulers, then the run's
    :class:`~taskfit.loops.state.TrainingState` whole. ``reader``: the one :func:`plan_resumed_run` returned (each
    file is then read once). ``callbacks_restored``: the callbacks' states were loaded already (the Lightning
    door's first step, :func:`taskfit.checkpoint.hook_dict.restore_modules_and_callbacks`), so not again. Returns the
    training state dict (for ``on_load_checkpoint``).

    Raises:
        CheckpointError: missing/corrupted files (naming the file) or a ``save_only_model`` checkpoint. A
            batch-size / world-size / dataset change mid-epoch continues by HF's rule (``global_step x
            gradient_accumulation_steps`` micro-batches of the new loader skipped), with a warning.
        UnsafeCheckpointError: a file needs full unpickling and ``weights_only`` is True.
    """
    loaded = read_checkpoint(strategy, path, run.model, run.optimizers, [c.scheduler for c in run.schedulers],
                             weights_only=weights_only, reader=reader)
    ts = loaded["training_state"]
    hf_rule = _check_compatible(args, strategy.world_size, run.train_loader, loaded["args"], ts,
                                loaded["manifest"], strategy.data_parallel_size)
    run.training_state.load_state_dict({**ts, "callbacks": {}} if callbacks_restored else ts)
    if hf_rule:  # a stream's saved position belongs to the old batch layout: HF's skip rule decides instead
        run.training_state.data = None
    if hf_rule or loaded["manifest"].get("format") == HF_FORMAT:  # no usable position: derive it as HF does
        place_hf_position(run.state, _batches_per_epoch(run.train_loader), args.gradient_accumulation_steps)
        if not hf_rule:
            log.info(adopt_message(path, ts["state"]))
    if not hf_rule:  # HF's position is already in the new layout's batches
        saved_batches = upgrade_training_state(ts)["plan"].get("batches_per_epoch")  # the old run's layout
        run.state.batch_in_epoch = _settled_position(run.state.batch_in_epoch, saved_batches,
                                                     _batches_per_epoch(run.train_loader), args.ignore_data_skip)
    if run.training_state.rng is None:
        log.warning("%s has no RNG state for rank %d (saved with world_size=%s); RNG streams restart from the seed.",
                    path, strategy.global_rank, loaded["manifest"].get("world_size"))
    run.resume_from, run.start_step = path, run.state.global_step
    log.info("Resuming from %s: epoch %d, global_step %d, %d micro-batches into the epoch.", path,
             run.state.current_epoch, run.state.global_step, run.state.batch_in_epoch)
    return ts


def _settled_position(position: int, saved_batches: int | None, n_batches: int | None,
                      ignore_data_skip: bool) -> int:
    """The micro-batch of the epoch a resumed run continues at: an epoch the checkpoint had consumed (saved after
    its last batch) stays consumed in the new layout (``n_batches``: nothing left of it, HF counts it as
    trained); otherwise the saved position, or 0 with ``ignore_data_skip`` (HF: restart the epoch)."""
    if saved_batches is not None and n_batches is not None and position >= saved_batches:
        return n_batches
    return 0 if ignore_data_skip else position


def resume_position(state: dict[str, Any], saved_batches: int | None, n_batches: int | None,
                    ignore_data_skip: bool) -> tuple[int, int]:
    """``(epoch, micro-batch in it)`` where a run resumed from a checkpoint's saved ``state`` (``FitState``
    fields of the current layout, :func:`~taskfit.loops.state.upgrade_training_state`: the resume point), whose
    run had ``saved_batches`` micro-batches per epoch, continues with ``n_batches``: :func:`_settled_position`
    (what :func:`restore` sets)."""
    epoch = int(state.get("current_epoch", 0))
    return epoch, _settled_position(int(state.get("batch_in_epoch", 0)), saved_batches, n_batches, ignore_data_skip)


class _PlannedReader(CheckpointReader):
    """The reader :func:`plan_resumed_run` reads the loop state with, returned to be handed on to :func:`restore`
    with the bytes it read, so a resume still reads each file once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: dict[str, bytes] = {}
        self.keeping = True

    def read_bytes(self, name: str) -> bytes:
        if name in self.kept:
            return self.kept.pop(name)
        data = super().read_bytes(name)
        if self.keeping:
            self.kept[name] = data
        return data


def plan_resumed_run(io: Any, path: str, loader: Any, args: Any, accumulation: Any,
                     planned: tuple[int | None, int, int],
                     weights_only: bool = True) -> tuple[int, int, CheckpointReader | None]:
    """``(max_steps, num_epochs, reader)`` of a run that resumes from checkpoint ``path`` with a different number of
    optimizer steps per epoch than the run that wrote it (another data-parallel size with the same per-device
    batch, another ``per_device_train_batch_size``, ``gradient_accumulation_steps`` or dataset size); ``planned``
    (``plan_steps`` on the new loader: ``(steps_per_epoch, max_steps, num_epochs)``) is returned unchanged when
    the steps per epoch did not change, the loader has no length, or the checkpoint was written by
    ``transformers.Trainer`` (HF's own rule applies: the position is derived from ``global_step``).

    The rule (the loop state keeps ``global_step`` and the data position, epoch and micro-batch, of the
    checkpoint; the steps still to take are counted on the new loader from that position):

    - ``max_steps`` > 0: the run ends at ``global_step == max_steps`` as planned (HF and Lightning stop there
      too); ``num_epochs`` becomes the epoch in which that step falls on the new layout.
    - otherwise (``num_train_epochs``): the run trains the epochs that are left, each on the new layout, and
      ends after the last one (Lightning's ``max_epochs`` rule); ``max_steps`` becomes ``global_step`` + the
      steps those epochs take (a fractional ``num_train_epochs`` cuts the last one as a fresh plan would), so
      the LR schedule, ratio intervals and the final save follow the steps actually left. HF instead keeps
      ``ceil(num_train_epochs x new steps per epoch)`` total steps and re-derives the epoch from
      ``global_step``, which trains more or fewer passes over the data than asked (with twice the processes it
      stops at once after half the epochs).

    Args:
        io (CheckpointIO): the run's checkpoint IO (reads the files; pass the returned ``reader``, None when no
            file was read, to :func:`restore`, which then reads them from the bytes kept here).
        path (str): the checkpoint folder the run resumes from.
        loader (DataLoader): the new run's training loader (this process's share).
        args (FitArguments): the new run's arguments (``max_steps``, ``num_train_epochs``,
            ``gradient_accumulation_steps``, ``ignore_data_skip``).
        accumulation (Callable[[int], int] | None): an accumulation schedule (epoch -> micro-batches per step).
        planned (tuple): ``plan_steps``' result for the new loader.
        weights_only (bool): read the checkpoint's files with ``torch.load(weights_only=...)``.

    Raises:
        CheckpointError: a corrupted ``training_state.pt`` or ``fit_args.json`` (named).
    """
    steps_per_epoch, max_steps, num_epochs = planned
    n = _batches_per_epoch(loader)
    if not n or not steps_per_epoch or is_hf_checkpoint(io, path):
        return max_steps, num_epochs, None
    reader = _PlannedReader(io, path, weights_only=weights_only)  # restore continues with it: no file read twice
    if not {"training_state.pt", "fit_args.json"} <= set(reader.files):
        return max_steps, num_epochs, reader  # save_only_model: restore refuses it with its own message
    ts, saved_args = reader.read("training_state.pt"), reader.read("fit_args.json")
    reader.keeping = False
    current = upgrade_training_state(ts)
    state = current.get("state") or {}
    n_before, accum_before = current["plan"].get("batches_per_epoch"), saved_args.get("gradient_accumulation_steps")
    if n_before is None or (n_before == n and accum_before in (None, args.gradient_accumulation_steps)):
        return max_steps, num_epochs, reader
    accum_at = accumulation or (lambda epoch: args.gradient_accumulation_steps)
    epoch, position = resume_position(state, n_before, n, args.ignore_data_skip)
    saved_at = int(state.get("batch_in_epoch", 0))
    if n_before != n and 0 < saved_at < n_before and not args.ignore_data_skip:  # mid-epoch in a new layout: HF's
        return max_steps, num_epochs, reader                                    # rule (restore places it so too)
        return max_steps, num_epochs, reader
    step = int(state.get("global_step", 0))
    # steps left in the epoch the run continues in (from its current micro-batch), then whole epochs
    partial = math.ceil((n - position) / accum_at(epoch)) if position else 0
    start = epoch + 1 if position else epoch
    if args.max_steps and args.max_steps > 0:
        left, end = max_steps - step - partial, start
        while left > 0:
            left -= math.ceil(n / accum_at(end))
            end += 1
        new_max, new_epochs = max_steps, end
    else:
        before = sum(math.ceil(n / accum_at(e)) for e in range(start))  # the fresh plan's steps before `start`
        new_max, new_epochs = step + partial + max(0, max_steps - before), max(num_epochs, start)
    log.info("Resuming with %d optimizer steps per epoch (the checkpoint's run took %s): %d steps left from "
             "global_step %d (epoch %d, micro-batch %d); max_steps %d -> %d, epochs %d -> %d.",
             steps_per_epoch, math.ceil(n_before / (accum_before or 1)), new_max - step, step, epoch, position,
             max_steps, new_max, num_epochs, new_epochs)
    return new_max, new_epochs, reader


def read_checkpoint(strategy: Any, path: str, model: Any, optimizers: Any = (), schedulers: Any = (),
                    weights_only: bool = True, full: bool = True,
                    reader: CheckpointReader | None = None) -> dict[str, Any]:
    """Read checkpoint ``path``: the model weights and, with ``full``, the optimizers' states through
    ``strategy.load_checkpoint`` (its shards, or the full files), then the schedulers' states; returns
    ``{"manifest", "args" (the saved arguments), "training_state"}`` (the last two with ``full``; the training state
    dict holds this rank's ``rng``). Every file is read once: verified against the manifest and loaded from the
    same bytes. ``reader``: a reader of ``path`` that already read some files (:func:`plan_resumed_run`); used when
    it matches ``weights_only`` and ``full``, else one is opened here.

    Raises:
        CheckpointError: a missing/corrupted file, a manifest lacking an entry the run needs, or (``full``) a
            ``save_only_model`` checkpoint.
        UnsafeCheckpointError: a file needs full unpickling and ``weights_only`` is True.
    """
    if reader is None or reader.folder != path or reader.weights_only != weights_only or not full:
        reader = open_checkpoint(strategy.checkpoint_io, path, weights_only=weights_only)
    manifest = reader.manifest
    if full and manifest.get("save_only_model"):
        raise CheckpointError(f"{path!r} was saved with save_only_model=True: it holds the weights but no optimizer, "
                              "scheduler, RNG or loop state, so training cannot continue exactly from it. Load the "
                              "weights into the model instead, or resume from a full checkpoint.")
    optimizers = list(optimizers) if full else []
    schedulers = [s for s in schedulers if s is not None] if full else []
    _require_entries(reader, shard_names(manifest), full, len(optimizers), len(schedulers))
    loaded = strategy.load_checkpoint(path, model, optimizers, reader=reader)
    out: dict[str, Any] = {"manifest": manifest}
    if not full:
        return out
    for i, sched in enumerate(schedulers):
        name = "scheduler.pt" if i == 0 else f"scheduler_{i}.pt"
        if name in manifest["files"]:
            sched.load_state_dict(select_scheduler_groups(reader.read(name), *loaded.groups.get(i, (None, 0))))
    out["args"] = reader.read("fit_args.json")
    ts = reader.read("training_state.pt")
    if not isinstance(ts, dict) or not {"state", "control", "precision"} <= set(ts):
        raise CheckpointError(f"{path!r}: training_state.pt does not hold the training state (keys state, control, "
                              "precision).")
    rng_name = f"rng_state_{strategy.global_rank}.pt"
    ts["rng"] = reader.read(rng_name) if rng_name in manifest["files"] else None
    data_name = DATA_STATE_NAME.format(rank=strategy.global_rank)  # a stateful iterable's position (JSON)
    ts["data"] = reader.read(data_name) if data_name in manifest["files"] else None
    out["training_state"] = ts
    verify_listed_files(reader, strategy.global_rank, strategy.world_size)
    return out


def verify_listed_files(reader: CheckpointReader, rank: int, world_size: int) -> list[str]:
    """Verify (size and SHA-256) every file the manifest lists that the resume did not read, so a damaged file
    is found when the checkpoint is resumed, not when ``transformers.Trainer`` or a person reads it later: HF's
    ``rng_state.pth``, ``trainer_state.json``, ``config.json``, another world size's ``rng_state_{r}.pt``. The
    small interop files (``rng_state.pth`` and JSON files) are also parsed, safely (``rng_state.pth`` with
    ``weights_only`` and exactly the numpy classes HF pickles), so a hostile file with a matching manifest entry
    is refused too. Global rank 0 checks them; under several processes, each rank's own ``rng_state_{r}.pt`` and
    strategy shards are checked by the rank that reads them. Returns the names checked here.

    Args:
        reader (CheckpointReader): the reader the resume read its files with (it knows what was verified).
        rank (int): this process's global rank; world_size (int): the number of processes.

    Raises:
        CheckpointError: a listed file is missing, truncated, corrupted or does not parse (names the file).
        UnsafeCheckpointError: ``rng_state.pth`` needs full unpickling and the reader is ``weights_only``.
    """
    if rank != 0:
        return []
    names = reader.unverified()
    if world_size > 1:  # read (and verified) by the ranks that hold them
        own = {f"rng_state_{r}.pt" for r in range(world_size)} | {DATA_STATE_NAME.format(rank=r)
                                                                  for r in range(world_size)}
        names = [n for n in names if n not in own and not n.startswith(SHARDS_PREFIX)]
    for name in names:
        if reader.files[name]["size"] > _PARSE_MAX_BYTES or not (name == HF_RNG_NAME or name.endswith(".json")):
            reader.verify(name)
        elif name == HF_RNG_NAME:
            with numpy_rng_globals():
                reader.read(name)
        else:
            reader.read(name)
    return names


#: bytes; listed interop files up to this size are parsed as well as hashed (HF's rng_state.pth is ~15 KB)
_PARSE_MAX_BYTES = 1 << 20


def _require_entries(reader: CheckpointReader, shards: list[str], full: bool, n_optimizers: int,
                     n_schedulers: int) -> None:
    """Refuse a manifest that lacks a file this run needs to continue exactly (instead of silently starting with
    a fresh optimizer or schedule)."""
    path = reader.folder
    require_model_entries(reader, shards)
    if not full:
        return
    require_entries(reader.manifest, path, ["fit_args.json", "training_state.pt"], "every full checkpoint has it")
    # sharded strategies keep the optimizer state in their shards
    names = [] if shards else ["optimizer.pt" if i == 0 else f"optimizer_{i}.pt" for i in range(n_optimizers)]
    require_entries(reader.manifest, path, names, "the run has an optimizer to restore")
    names = ["scheduler.pt" if i == 0 else f"scheduler_{i}.pt" for i in range(n_schedulers)]
    require_entries(reader.manifest, path, names, "the run has an LR scheduler to restore")


def _check_compatible(a: Any, world_size: int, train_loader: Any, saved: dict[str, Any], ts: dict[str, Any],
                      manifest: dict[str, Any], data_parallel_size: int | None = None) -> bool:
    """Warn about settings that differ from the checkpoint's; True when the run must take HF's position rule
    (a mid-epoch checkpoint whose batch layout changed: batch size, data-parallel size or dataset length)."""
    current = upgrade_training_state(ts)
    state = current["state"]  # the resume point: an epoch's end is the next one's start
    n_batches = _batches_per_epoch(train_loader)
    before_batches = current["plan"].get("batches_per_epoch")  # the old run's layout
    # saved after the epoch's last batch (a step-based save at the epoch end): no sample position is left to
    # keep, whatever the layout now
    consumed = before_batches is not None and state.get("batch_in_epoch", 0) >= before_batches
    mid_epoch = state.get("batch_in_epoch", 0) > 0 and not a.ignore_data_skip and not consumed
    changes = []
    before = saved.get("per_device_train_batch_size")
    if before is not None and before != a.per_device_train_batch_size:
        changes.append(f"per_device_train_batch_size {before} -> {a.per_device_train_batch_size}")
    # the sample position depends on the processes that read different data: the data-parallel size (the world
    # size except under tensor parallelism, whose ranks share their samples)
    world_before = manifest.get("world_size")
    dp_before = manifest.get("data_parallel_size", world_before)
    dp_now = world_size if data_parallel_size is None else data_parallel_size
    if dp_before is not None and dp_before != dp_now:
        dp_text = f" (data-parallel size {dp_before} -> {dp_now})" if (dp_before, dp_now) != (world_before, world_size) \
            else ""
        changes.append(f"world_size {world_before} -> {world_size}{dp_text}")
    if before_batches is not None and n_batches is not None and before_batches != n_batches:
        why = "" if changes else " (the dataset or drop_last changed?)"  # else the batch or world size explains it
        changes.append(f"batches per epoch {before_batches} -> {n_batches}{why}")
    hf_position = bool(changes) and mid_epoch
    accum_before = saved.get("gradient_accumulation_steps")
    if accum_before is not None and accum_before != a.gradient_accumulation_steps:
        changes.append(f"gradient_accumulation_steps {accum_before} -> {a.gradient_accumulation_steps}")
    _warn_as_hf(a, saved)
    if hf_position:  # the saved sample position means nothing in the new layout: HF's rule, from global_step
        log.warning("Resuming mid-epoch with changed settings (%s): the saved sample position does not exist in the "
                    "new batch layout, so the run skips global_step x gradient_accumulation_steps micro-batches of "
                    "the new loader, as transformers.Trainer does; it will not match an uninterrupted run. Pass "
                    "ignore_data_skip=True to restart that epoch from its first batch instead.", "; ".join(changes))
    elif changes:
        log.warning("Resuming with changed settings (%s): the run continues from the checkpoint's position but "
                    "will not match an uninterrupted run with the original settings.", "; ".join(changes))
    return hf_position


def _warn_as_hf(a: Any, saved: dict[str, Any]) -> None:
    """HF's warning for arguments that differ from the checkpoint's (mirrors
    ``Trainer.compare_trainer_and_checkpoint_args``, its words, on the ``transformers.trainer`` logger, where
    scripts written for HF look for it)."""
    text = ""
    for name in ("logging_steps", "eval_steps", "save_steps", "per_device_train_batch_size"):
        now, before = getattr(a, name, None), saved.get(name)
        if now is not None and before is not None and now != before:
            text += f"\n\t{name}: {now} (from args) != {before} (from trainer_state.json)"
    if text:
        logging.getLogger("transformers.trainer").warning(
            "Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
            "checkpoint directory: %s", text)


def _batches_per_epoch(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def load_best_model(fit: FitView) -> dict[str, Any]:
    """``load_best_model_at_end``: load the weights of ``state.best_model_checkpoint`` into the model; returns
    ``{"best_global_step", "best_metric", "best_model_checkpoint"}`` for the train metrics (empty when no best
    checkpoint was recorded)."""
    st = fit.state
    if not st.best_model_checkpoint:
        log.warning("load_best_model_at_end=True but no best checkpoint was recorded (no evaluation with a save).")
        return {}
    fit.strategy.checkpoint_io.wait()
    # sharded strategies restore their own shards (or cut full weights into shards); others load the full file
    fit.strategy.load_checkpoint(st.best_model_checkpoint, fit.model)
    log.info("Loaded the best model from %s (global_step %s, %s=%s).", st.best_model_checkpoint,
             st.best_global_step, fit.args.metric_for_best_model, st.best_metric)
    return {"best_global_step": st.best_global_step, "best_metric": st.best_metric,
            "best_model_checkpoint": st.best_model_checkpoint}


def finish_checkpoints(fit: FitView, metrics: dict[str, Any], publisher: Any = None) -> dict[str, Any]:
    """End of ``fit``: wait for a background save (raising its failure), load the best model
    (``load_best_model_at_end``), with ``save_total_limit=1`` delete every checkpoint but the best one (HF: the
    newest was kept during training for resuming), publish the final model (``push_to_hub``) and wait for every
    push. Returns the metrics to add: the best checkpoint's step/metric/path and ``push_errors`` (failed pushes, never raised).

    Raises:
        CheckpointSaveError: a background checkpoint save failed.
    """
    fit.strategy.checkpoint_io.wait()
    out: dict[str, Any] = {}
    if fit.args.load_best_model_at_end:
        out.update(load_best_model(fit))
    best = fit.state.best_model_checkpoint
    if fit.args.save_total_limit == 1 and best:
        from taskfit.checkpoint.writer import is_writer
        from taskfit.io.checkpoint_format import rotate_checkpoints

        if is_writer(fit):  # HF: at the end, save_total_limit=1 keeps the best checkpoint alone
            rotate_checkpoints(fit.strategy.checkpoint_io, fit.args.output_dir, 1, {best})
    weights = None
    if fit.args.push_to_hub:  # the full weights may be a gather: every rank takes part, rank 0 publishes
        from taskfit.checkpoint.publish import push_final
        from taskfit.strategies.checkpointing import exportable_model

        weights = fit.strategy.model_state_dict(exportable_model(fit.model))
    if publisher is not None:
        push_final(fit, publisher, {**metrics, **out}, weights=weights)
        errors = publisher.finish()
        if errors:
            out["push_errors"] = len(errors)
    return out


def wait_for_saves_quietly(io: Any) -> None:
    """On a failing run: let a background checkpoint save finish (so it is not lost), logging its own failure
    instead of masking the run's exception."""
    try:
        io.wait()
    except Exception:
        log.exception("A background checkpoint save failed while the run was failing.")
