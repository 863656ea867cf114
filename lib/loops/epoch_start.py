"""Where an epoch of the fit loop begins (F-LOOP-1, F-LOOP-6): a reloaded train loader, the epoch's hooks,
accumulation and schedulers, and its batch iterator from the resume position. Called once per epoch by
:class:`~taskfit.loops.fit_loop.FitLoop` (``loop``), whose per-epoch attributes they set."""

from __future__ import annotations

import math
from typing import Any

from taskfit.data.loaders import set_loader_epoch, skip_first_batches
from taskfit.data.stateful import decode_state


def reload_train_loader(loop: Any, epoch: int, num_epochs: int) -> Any:
    """A new train loader for ``epoch`` (``run.reload_train_loader``); without an explicit ``max_steps`` the
    steps of the epochs left are re-counted from its length."""
    run, state = loop.run, loop.run.state
    state.current_epoch = epoch  # what the loader's source reads (trainer.current_epoch)
    loader = run.train_loader = run.reload_train_loader()
    try:
        n = len(loader)
    except TypeError:
        n = None
    loop.batches_per_epoch = n
    changes: dict[str, Any] = {"batches_per_epoch": n}
    if n and not loop.explicit_max_steps:
        left = sum(math.ceil(n / loop.accum_at(e)) for e in range(epoch, num_epochs))
        changes["max_steps"] = loop.limit_count() + left
    run.plan = run.plan.replace(**changes)  # a re-plan: the new loader's layout and steps
    return loader


def start_epoch(loop: Any, loader: Any, epoch: int, skip: int, finished: bool) -> Any:
    """The epoch's start: hooks, the accumulation and schedulers of this epoch, and its batch iterator (after
    ``skip`` micro-batches when resumed mid-epoch). The resume's RNG states are applied here, once
    (``TrainingState.restore_rng``), at the point where the saved run took them: the start of an epoch (before
    its hooks and iterator) or, mid-epoch, the next window (after them)."""
    run, args, hooks = loop.run, loop.args, loop.hooks
    state, control, module, training_state = run.state, run.control, run.module, run.training_state
    if not skip:
        training_state.restore_rng()  # saved at an epoch's start
    training_state.epoch_ended = False
    loop.skipped_rest = False  # on_train_batch_start returned -1 in this epoch (Lightning)
    state.current_epoch = epoch
    set_loader_epoch(loader, epoch)
    control._new_epoch()
    # resumed mid-epoch: keep the restored epoch aggregates; a fresh run's first epoch keeps what
    # on_train_start logged (Lightning resets after each epoch, so those reach epoch 0's values)
    if not skip and not (epoch == loop.first_epoch and run.resume_from is None):
        module._results.reset_epoch()
    if not (skip and loop.loop_policy.resumed_epoch_skips_start):  # Lightning: once per epoch, not on resume
        defaults, module._log_defaults = module._log_defaults, (False, True)  # Lightning's defaults in this hook
        try:
            hooks.call("on_train_epoch_start", loop.owner, module)
        finally:
            module._log_defaults = defaults
    hooks.hf["on_epoch_begin"] and hooks.call_hf("on_epoch_begin", args, state, control, **run.hf_kwargs())
    # read per epoch: a callback may change them at the epoch's start (Lightning's
    # GradientAccumulationScheduler, StochasticWeightAveraging's SWALR)
    loop.accum = loop.accum_at(epoch)
    loop.counts_needed = not loop.manual and (loop.accum > 1 or loop.world > 1)
    schedulers = run.schedulers
    loop.step_schedulers = [c for c in schedulers if c.interval == "step"]
    loop.epoch_schedulers = [c for c in schedulers if c.interval == "epoch" and not c.reduce_on_plateau]
    loop.plateau_schedulers = [c for c in schedulers if c.interval == "epoch" and c.reduce_on_plateau]
    if finished:
        control.should_training_stop = True
        iterator = iter(())
    else:
        iterator = iter(resumed_data(training_state, loader, skip))
    state.batch_in_epoch = skip
    training_state.restore_rng()  # saved mid-epoch (a no-op when applied above)
    return iterator


def resumed_data(training_state: Any, loader: Any, skip: int) -> Any:
    """``loader`` from micro-batch ``skip`` of the epoch: a stateful iterable loads its saved state (nothing
    consumed is read again), anything else skips (:func:`skip_first_batches`). ``training_state``
    (TrainingState | None) holds the restored position, taken once."""
    saved = training_state.data if training_state is not None else None
    if training_state is not None:
        training_state.data = None  # loaded once: a later epoch starts from its beginning
    if skip and saved is not None and training_state.data_source is not None:
        training_state.data_source.load_state_dict(decode_state(saved))
        return loader
    return skip_first_batches(loader, skip)
