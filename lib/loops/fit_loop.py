"""The fit loop: epochs, accumulation windows, clipping, optimizer/scheduler steps and the log / evaluate /
save triggers (F-LOOP-1..3, F-LOOP-6). One optimizer step = one window of ``gradient_accumulation_steps``
micro-batches (the last window of an epoch may be shorter)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from taskfit.core.hooks import MONITORING_EPOCH_END, TRANSFER_HOOKS, batch_mover, overrides
from taskfit.core.module import TaskModule, infer_batch_size
from taskfit.data.loaders import shutdown_workers, splits_evenly
from taskfit.data.stateful import stateful_source
from taskfit.loops.epoch_start import reload_train_loader, start_epoch
from taskfit.loops.finite import check_finite
from taskfit.loops.optimization import AutomaticStep, ManualStep, batch_outputs, choose_policy, window_weights
from taskfit.loops.plan import accumulation_schedule, plan_steps, resolve_interval  # noqa: F401 (their old home)
from taskfit.loops.policy import LoopPolicy
from taskfit.loops.schedulers import step_scheduler

if TYPE_CHECKING:
    from taskfit.protocols import RunView


class FitLoop:
    """Drives training for one ``Fit.fit`` call: the run owns the objects, this class owns the order (epochs and
    windows); one window's step is :mod:`taskfit.loops.optimization`'s.

    Args:
        run (Run): the run, already set up (module on device, optimizers and schedulers from ``Strategy.setup``,
            loaders, state; restored when resuming).
        owner (Fit): what callbacks receive as ``fit``.
        args (FitArguments): the run's options.
        strategy (Strategy): placement and communication.
        hooks (HookRunner): the resolved callback hooks.
        log (Callable[[dict], None]): sends a log row to loggers and ``on_log``.
        evaluate (Callable[[], dict]): evaluation during training (metrics).
        save (Callable[[dict], str]): writes a checkpoint of the given training state; returns its path.
        loop_policy (LoopPolicy): where Lightning's loop semantics differ from HF's (chosen by the owner once; HF's
            defaults when not given).
        hf_step (Callable | None): the run's HF ``training_step`` override, resolved by the owner before the loop
            (:func:`~taskfit.loops.optimization.choose_policy` puts it into the step policy); None: none.
    """

    def __init__(self, run: RunView, owner: Any, args: Any, strategy: Any, hooks: Any, log: Callable[[dict], None],
                 evaluate: Callable[[], dict], save: Callable[[dict], str],
                 loop_policy: LoopPolicy | None = None, hf_step: Any = None) -> None:
        self.run, self.owner, self.args, self.strategy, self.hooks = run, owner, args, strategy, hooks
        self.hf_step = hf_step
        self.loop_policy = loop_policy if loop_policy is not None else LoopPolicy()
        self._plateau_due: list[Any] = []  # step-interval plateau schedulers waiting for the batch's validation
        self._log, self._evaluate, self._save = log, evaluate, save
        self.sums = run.sums
        self._norm_due = False  # the last step's gradient norm is not computed yet (only for a log row or a save)
        self.stop: Any = None  # taskfit.fit.signals.GracefulStop: read once per optimizer step
        self.step_lr: float | None = None
        self.lossless_steps = self.lossless_total = 0  # see _prepare
        self.loss_seen = True
        self.skipped_rest = False
        self.windows = self.windows_at_start = self._manual_seen = 0
        self.manual = self.explicit_max_steps = self.count_optimizer_steps = self.limit_counts_windows = False
        self._free_after: Any = ()
        self.min_epochs = self.min_steps = 0
        self.first_epoch = 0  # the epoch this run starts at
        self._min_flags: tuple[Any, Any] = (None, None)
        self._min_told = False
        self.epoch_iterator: Any = None  # kept (with its workers) until the next epoch's or teardown(): Lightning

    def teardown(self) -> None:
        """Shut the train and validation loaders' workers down (end of training, an error): Lightning's teardown."""
        self.epoch_iterator = None
        for loader in (self.run.train_loader, *(self.run.eval_loaders or {}).values()):
            shutdown_workers(loader)

    def _prepare(self, loader: Any) -> None:
        """Decide once per run what every window needs: the step (automatic or manual) and its policy, the
        accumulation per epoch, how item counts are weighed, the batch mover."""
        run, args, strategy, sums = self.run, self.args, self.strategy, self.sums
        module = run.module
        scheduled = accumulation_schedule(self.owner.callbacks)
        self.accum_at = scheduled or (lambda epoch, accum=args.gradient_accumulation_steps: accum)
        self.manual = not module.automatic_optimization
        # manual optimization, Lightning's policy: global_step counts optimizer steps (two optimizers -> 2 per
        # batch), the log / evaluate / save intervals count batches (Lightning's _batches_that_stepped); HF's
        # policy keeps one step per batch
        policy = self.loop_policy
        self.count_optimizer_steps = self.manual and policy.counts_optimizer_steps
        self._manual_seen = module.__dict__.get("_manual_steps", 0)
        self.explicit_max_steps = bool(args.max_steps and args.max_steps > 0)
        self.limit_counts_windows = self.count_optimizer_steps and not self.explicit_max_steps  # see limit_count
        # Lightning's Trainer(min_epochs=, min_steps=): a stop request waits until both are met (HF has neither)
        self._min_flags = (policy.min_epochs, policy.min_steps)
        self.min_epochs, self.min_steps = (v or 0 for v in self._min_flags)
        self._min_told = False
        self.policy = choose_policy(run, strategy, self.manual, scheduled is not None, args, self.hooks, self.hf_step)
        self.step = ManualStep(self) if self.manual else AutomaticStep(self, self.policy)
        self.step.free_gradients()  # gradients left from before the run (zeroed in the first closure otherwise)
        # what step.free_gradients() zeroes after each step's log row (HF's order), as a list: no call per step
        self._free_after = self.step.freed_optimizers() if self.policy.zero_grad_after_step else ()
        self._norm_of = ([p for p in module.parameters() if p.requires_grad], run.optimizers[0])
        sums.start(strategy.root_device, bool(args.logging_nan_inf_filter))
        self.world = world = strategy.world_size
        # manual optimization whose training_step returns no loss: those steps add nothing to the logged loss
        # (Lightning logs only what it is given); counted per log window and over the run
        self.lossless_steps = self.lossless_total = 0
        self.loss_seen = not self.manual or bool(sums.total_loss)
        readers = strategy.data_parallel_size  # tensor-parallel ranks share their samples
        self.readers = readers
        # None: the batch is used as loaded (a CPU device, no input cast, no transfer hook): no call per micro-batch
        plain_batch = ("batch" in strategy.plain_step_parts()
                       and not any(overrides(module, n) for n in TRANSFER_HOOKS))
        self.move = None if plain_batch else batch_mover(module, strategy)
        # batch-size item counts are equal on every process when the loader splits evenly or is not split (tensor
        # parallel ranks read the same batches): no per-step all-reduce (a custom num_items, e.g. a token count,
        # may differ per process and is all-reduced)
        self.even_counts = (world > 1 and (readers == 1 or splits_evenly(loader))
                            and getattr(type(module), "num_items", None) is TaskModule.num_items)
        try:
            self.batches_per_epoch = len(loader)
        except TypeError:
            self.batches_per_epoch = None
        self._window: list[Any] = []
        if run.training_state is not None:  # a checkpoint saves this stream's position, a resume loads it
            run.training_state.data_source = stateful_source(loader)

    def run_epochs(self, loader: Any, steps_per_epoch: int | None, num_epochs: int) -> None:
        """Train until ``state.max_steps`` or ``num_epochs`` or a stop flag; a restored run continues where its
        checkpoint was taken (also when that was after the last step: only the end of the run is left): the
        restored state is the resume point (epoch, micro-batch in it), nothing is adjusted here."""
        run, state, sums = self.run, self.run.state, self.sums
        self._prepare(loader)
        resumed = run.resume_from is not None
        self.windows = state.global_step  # windows (batches under manual optimization) done so far
        if self.manual and self.batches_per_epoch:
            self.windows = state.current_epoch * self.batches_per_epoch + state.batch_in_epoch
        self.windows_at_start = self.windows
        finished = resumed and self.limit_count() >= state.max_steps  # saved at the last step: only the end is left
        # Lightning's Trainer(reload_dataloaders_every_n_epochs=n): a new train loader every n epochs (HF: never)
        last_reload = self.first_epoch = state.current_epoch
        if self.loop_policy.max_epochs is not None:  # Lightning's max_epochs limits whatever max_steps says
            num_epochs = min(num_epochs, self.loop_policy.max_epochs)
        for epoch in range(state.current_epoch, num_epochs):
            if self.loop_policy.stop_checked_before_epoch and run.control.should_training_stop and self._may_stop(epoch):
                break
            if run.reload_train_loader is not None and self.loop_policy.reload_due(epoch, last_reload):
                loader, last_reload = reload_train_loader(self, epoch, num_epochs), epoch
            skip = state.batch_in_epoch if resumed else 0
            self.epoch_iterator = start_epoch(self, loader, epoch, skip, finished)
            resumed = False
            if not finished:
                self._run_windows(self.epoch_iterator, epoch)
            self._end_epoch(epoch)
            if run.control.should_training_stop and self._may_stop(epoch + 1):
                break
        if sums.steps_since_log > self.lossless_steps:
            sums.total_loss += float(self._global_tr_loss())
        # weights that became non-finite after the last logging/save step would end the run silently: one
        # check (one host sync) per run, whatever the logging and save intervals
        check_finite(self.strategy, run.module, state.global_step, self.args.output_dir)

    def _run_windows(self, iterator: Any, epoch: int) -> None:
        """The epoch's windows, one optimizer step each, until the data ends or a stop flag is set."""
        control, state, accum, window = self.run.control, self.run.state, self.accum, self._window
        while True:
            window.clear()  # one list reused for the run, refilled with the next `accum` batches (fewer at the end)
            for _ in range(accum):
                try:
                    window.append(next(iterator))
                except StopIteration:
                    break
            if not window:
                if state.batch_in_epoch == 0:  # an epoch without a single batch would repeat forever
                    raise ValueError(f"The train data yielded no batch in epoch {epoch}; check the dataset "
                                     "(an empty IterableDataset?).")
                break
            self._run_window(window, epoch)
            if (control.should_training_stop and self._may_stop(epoch)) or control.should_epoch_stop:
                break

    def _may_stop(self, epochs_done: int) -> bool:
        """Whether a stop request ends training now: always at the step limit, else once ``min_epochs`` epochs
        are done and ``min_steps`` steps taken (Lightning's ``_can_stop_early``, with its info message once)."""
        if not (self.min_epochs or self.min_steps) or self.limit_count() >= self.run.state.max_steps:
            return True
        if epochs_done >= self.min_epochs and self.run.state.global_step >= self.min_steps:
            return True
        if not self._min_told:
            self._min_told = True
            logging.getLogger("taskfit").info(
                "Trainer was signaled to stop but the required `min_epochs=%r` or `min_steps=%r` has not been met. "
                "Training will continue...", *self._min_flags)  # Lightning's message
        return False

    def _weights(self, window: list[Any]) -> list[Any] | None:
        """The micro-batch loss weights of ``window`` (None: every weight is 1)."""
        if not (self.counts_needed and (len(window) > 1 or self.world > 1)):
            return None
        module, strategy = self.run.module, self.strategy
        # item counts may be 0-dim tensors: weights stay tensors, so no host sync here
        return window_weights([module.num_items(b) for b in window], self.world, self.even_counts, strategy.reduce,
                              strategy.root_device)

    def _run_window(self, window: list[Any], epoch: int) -> None:
        """One optimizer step: the window's micro-batches through the step, then the step's bookkeeping."""
        run, args, hooks, step = self.run, self.args, self.hooks, self.step
        state, control, module, sums, fit = run.state, run.control, run.module, self.sums, self.owner
        L, H = hooks.lightning, hooks.hf
        results, move = module._results, self.move
        mode_optimizers = self.policy.mode_optimizers
        step.start_window(window, self._weights(window) if self.counts_needed else None, epoch)
        last = len(window) - 1
        window_samples, window_flos, flos_of = 0, 0.0, run.flos_of
        for i in range(last + 1):
            batch = window[i] if move is None else move(window[i])
            results.set_batch(batch)
            batch_idx = state.batch_in_epoch
            if L["on_train_batch_start"] and hooks.call("on_train_batch_start", fit, module, batch, batch_idx) == -1:
                self._skip_rest_of_epoch(epoch, batch_idx)
                return
            if i == 0 and H["on_step_begin"]:
                hooks.call_hf("on_step_begin", args, state, control, **run.hf_kwargs())
            for opt in mode_optimizers:  # schedule-free: back to the train point after an evaluation (HF)
                opt.train()
            out, loss = step.micro_batch(i, batch, batch_idx)
            if loss is None:  # manual optimization, no loss returned (windows hold one batch)
                self.lossless_steps += 1
                self.lossless_total += 1
            else:  # in place on the training device: nothing kept or converted per step (DESIGN's hot path)
                sums.add(loss.detach())
            window_samples += infer_batch_size(batch)
            if flos_of is not None:  # HF's count, per micro-batch (shapes only: no host sync)
                window_flos += float(flos_of(batch))
            state.batch_in_epoch += 1
            if i != last:
                H["on_substep_end"] and hooks.call_hf("on_substep_end", args, state, control)
                L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, batch_outputs(out, loss),
                                                        batch, batch_idx)
        self._after_window(epoch, batch_idx, step.finish_window(), window_samples,
                           window_flos if flos_of is not None else None)
        L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, batch_outputs(out, loss), batch,
                                                batch_idx)
        self._after_step(epoch_end=False)

    def _skip_rest_of_epoch(self, epoch: int, batch_idx: int) -> None:
        """``on_train_batch_start`` returned -1 (Lightning): this batch and the rest of the epoch are not run and
        the window takes no optimizer step; the batch counts as the epoch's last (the step schedulers due at it and
        the epoch schedulers step), and the epoch ends without its validation."""
        self.run.control.should_epoch_stop = True
        self.skipped_rest = True
        self.run.state.batch_in_epoch += 1
        if self.manual:  # Lightning steps no scheduler under manual optimization
            return
        for cfg in self.step_schedulers:
            if (batch_idx + 1) % cfg.frequency == 0:
                step_scheduler(self, cfg)
        for cfg in self.epoch_schedulers:
            if (epoch + 1) % cfg.frequency == 0:
                step_scheduler(self, cfg)

    def _after_window(self, epoch: int, batch_idx: int, stepped: bool, window_samples: int,
                      window_flos: float | None = None) -> None:
        """After the optimizer step: the step's hooks, the schedulers it steps, the counters it advances."""
        run, hooks, state, sums = self.run, self.hooks, self.run.state, self.sums
        hooks.hf["on_optimizer_step"] and hooks.call_hf("on_optimizer_step", self.args, state, run.control)
        self.step_lr = run.optimizers[0].param_groups[0]["lr"]  # the rate this step used (HF 5 logs it)
        if stepped:  # Lightning: every `frequency` batches of the epoch (HF: every step)
            for cfg in self.step_schedulers:
                if (batch_idx + 1) % cfg.frequency == 0:
                    if cfg.reduce_on_plateau and self.loop_policy.plateau_steps_after_validation:
                        self._plateau_due.append(cfg)  # stepped in _after_step, after the batch's validation
                    else:
                        step_scheduler(self, cfg)
        batches_per_epoch = self.batches_per_epoch
        if not self.manual and state.batch_in_epoch == batches_per_epoch:  # Lightning: the epoch's last batch
            for cfg in self.epoch_schedulers:  # steps them (not an epoch cut short by max_steps)
                if (epoch + 1) % cfg.frequency == 0:
                    step_scheduler(self, cfg)
        sums.steps_since_log += 1
        self.windows += 1
        if self.count_optimizer_steps:
            taken = run.module.__dict__.get("_manual_steps", 0)
            state.global_step += taken - self._manual_seen
            self._manual_seen = taken
        else:
            state.global_step += 1
        # a loader without length counts its epoch in parts of max_steps x accumulation micro-batches (HF)
        per_epoch = batches_per_epoch or state.max_steps * self.args.gradient_accumulation_steps
        state.epoch = epoch + (state.batch_in_epoch / per_epoch if per_epoch else 0.0)
        state.samples_seen += window_samples * self.readers  # every data-parallel rank takes as many
        flos = run.flos_per_sample * window_samples if window_flos is None else window_flos
        state.total_flos += flos * self.readers  # HF sums every process's count
        results = run.module._results
        if results.values:  # Lightning's callback_metrics hold the step's self.log values (logger=False too)
            results.update_callback_metrics(self.owner.callback_metrics, synced_too=self.world == 1)

    def _end_epoch(self, epoch: int) -> None:
        """The epoch's end: epoch schedulers, the epoch's log row, validation and save, plateau schedulers."""
        run, hooks, fit, args = self.run, self.hooks, self.owner, self.args
        state, control, module = run.state, run.control, run.module
        if (not ((control.should_training_stop and self._may_stop(epoch)) or control.should_epoch_stop)
                and self.batches_per_epoch is not None):
            state.epoch = float(epoch + 1)  # the epoch ran to its end (without a length HF keeps the fraction)
        if not self.manual and self.batches_per_epoch is None:  # a loader without length: at the end of the epoch
            for cfg in self.epoch_schedulers:
                if (epoch + 1) % cfg.frequency == 0:
                    step_scheduler(self, cfg)
        # HF's DefaultFlowCallback raises the epoch flags before the user callbacks' on_epoch_end runs
        control.should_log = control.should_log or args.logging_strategy == "epoch"
        control.should_evaluate = control.should_evaluate or (args.eval_strategy == "epoch" and not self.skipped_rest
                                                              and (args.eval_delay or 0) <= state.epoch)
        control.should_save = control.should_save or args.save_strategy == "epoch"
        hooks.hf["on_epoch_end"] and hooks.call_hf("on_epoch_end", args, state, control, **run.hf_kwargs())
        # Lightning's policy: a checkpoint taken during the closing validation (ModelCheckpoint after it) resumes at
        # the next epoch's start; HF's resumes before that validation and runs it again
        run.training_state.epoch_ended = self.loop_policy.validation_closes_epoch
        self._after_step(epoch_end=True, save=False)  # the epoch's loss row and validation (Lightning: before
        defaults, module._log_defaults = module._log_defaults, (False, True)  # Lightning's epoch-end defaults
        module._log_fx = "on_train_epoch_end"  # its values apart from the steps' of the same name (Lightning)
        # a checkpoint from here on (ModelCheckpoint's in on_train_epoch_end, the epoch's save below) resumes at
        # the next epoch's start; Lightning's policy: not one of an epoch cut short by max_steps (a resume with
        # more steps continues that epoch at its next batch)
        complete = self.batches_per_epoch is None or state.batch_in_epoch == self.batches_per_epoch
        run.training_state.epoch_ended = complete or not self.loop_policy.validation_closes_epoch
        try:
            hooks.call("on_train_epoch_end", fit, module)  # on_train_epoch_end, which may log epoch values)
            if hooks.lightning[MONITORING_EPOCH_END]:  # EarlyStopping: after the module, on the epoch's values
                self._epoch_callback_metrics()
                hooks.call(MONITORING_EPOCH_END, fit, module)
        finally:
            module._log_defaults, module._log_fx = defaults, ""
        epoch_values = self._epoch_callback_metrics()
        hidden = module._results.hidden_names()
        epoch_logs = {k: v for k, v in epoch_values.items() if k not in hidden}
        if epoch_logs:
            self._log(epoch_logs)
        if control.should_save:
            self._save(run.training_state.state_dict())
        control._new_step()
        for cfg in () if self.manual or not complete else self.plateau_schedulers:  # after validation, on the
            if (epoch + 1) % cfg.frequency == 0:  # epoch's metrics; not an epoch cut short by max_steps (Lightning)
                step_scheduler(self, cfg)

    def _epoch_callback_metrics(self) -> dict[str, Any]:
        """The epoch's ``self.log`` aggregates so far into ``callback_metrics`` (Lightning: logger=False values
        too, and ``name`` for ``name_epoch``); returns them."""
        epoch_values = self.run.module._results.epoch_values()
        metrics = self.owner.callback_metrics
        metrics.update(epoch_values)
        metrics.update({k[:-len("_epoch")]: v for k, v in epoch_values.items() if k.endswith("_epoch")})
        return epoch_values

    def _after_step(self, epoch_end: bool, save: bool = True) -> None:
        """Set and act on the log / evaluate / save / stop flags (mirrors HF ``DefaultFlowCallback`` +
        ``_maybe_log_save_evaluate``); with ``save=False`` the save flag is left for the caller."""
        run, args, hooks, sums = self.run, self.args, self.hooks, self.sums
        state, control = run.state, run.control
        step = self.windows if self.manual else state.global_step
        signum = self.stop.poll() if self.stop is not None and not epoch_end else 0
        if signum:  # SIGTERM / Ctrl-C / SLURM requeue: this step is the last one
            control.should_training_stop = True
            control.should_save = control.should_save or self.stop.should_save(signum)
        if not epoch_end:
            plan = state.plan  # its fields as plain attributes (the state's properties read it per call)
            if args.logging_strategy == "steps" and (step % plan.logging_steps == 0
                                                     or (step == 1 and args.logging_first_step)):
                control.should_log = True
            if args.eval_strategy == "steps" and step % plan.eval_steps == 0 and (args.eval_delay or 0) <= step:
                control.should_evaluate = True
            if args.save_strategy == "steps" and step % plan.save_steps == 0:
                control.should_save = True
            if (self.windows if self.limit_counts_windows else state.global_step) >= plan.max_steps:  # limit_count
                control.should_training_stop = True
                control.should_save = control.should_save or args.save_strategy == "steps"  # HF: save at the end
                if args.eval_strategy == "steps" and step % plan.eval_steps and (args.eval_delay or 0) <= step:
                    control.should_evaluate = True  # HF 5: a last evaluation when max_steps is off the grid
            if hooks.hf["on_step_end"]:
                hooks.call_hf("on_step_end", args, state, control, **run.hf_kwargs())
        if self._norm_due and (control.should_log or control.should_save):  # kept otherwise: an epoch-end log
            self._norm_due = False  # row may still read it; the step's gradients are intact
            params, optimizer = self._norm_of
            sums.grad_norm = self.strategy.clip_gradients(params, math.inf, optimizer)
        logging_step = control.should_log
        if control.should_log and sums.steps_since_log:
            with_loss = sums.steps_since_log - self.lossless_steps
            logs = {}
            if with_loss:
                tr_loss = float(self._global_tr_loss())
                sums.total_loss += tr_loss
                self.loss_seen = True
                logs["loss"] = tr_loss / with_loss  # unrounded, as HF 5
            sums.clear()
            sums.steps_since_log = self.lossless_steps = 0
            if sums.grad_norm is not None:
                logs["grad_norm"] = float(sums.grad_norm)
            step_lr = self.step_lr
            logs["learning_rate"] = step_lr if step_lr is not None else run.optimizer.param_groups[0]["lr"]
            logs.update(self.strategy.precision.log_values())  # 16-mixed: loss_scale, skipped_steps
            if not self.loop_policy.logs_run_values:  # Lightning: the row holds only what self.log wrote
                logs = {}
            logs.update(run.module._results.step_values())
            if logs:
                self._log(logs)
            control.should_log = False  # HF's on_log clears it: a save after the row records False, as HF's
        if logging_step or control.should_save:  # the only host sync it adds: on logging and save steps
            check_finite(self.strategy, run.module, step, args.output_dir)  # after the log row, before a save
        if not epoch_end:  # the step's gradients are read (norm, log row): free them before evaluation and the
            for opt in self._free_after:  # next forward (step.free_gradients(), inlined)
                opt.zero_grad(set_to_none=True)
        if control.should_evaluate:
            self._evaluate()
        if self._plateau_due and (epoch_end or state.batch_in_epoch != self.batches_per_epoch):
            for cfg in self._plateau_due:  # an epoch's last batch waits for the validation closing the epoch
                step_scheduler(self, cfg)
            self._plateau_due.clear()
        if not save:
            return
        if control.should_save:
            self._save(run.training_state.state_dict())
        if signum:
            raise self.stop.stop(self.strategy.checkpoint_io, args.output_dir, step, self.strategy.is_global_zero)
        control.should_save = control.should_evaluate = control.should_log = False  # control._new_step(), inlined

    def limit_count(self) -> int:
        """What ``state.max_steps`` limits: optimizer steps, except when ``global_step`` counts every optimizer's
        steps (manual optimization, Lightning door) without an explicit ``max_steps``: then the derived limit counts
        batches (the epochs decide, as Lightning)."""
        if self.limit_counts_windows:
            return self.windows
        return self.run.state.global_step

    def _global_tr_loss(self) -> torch.Tensor:
        """The loss sum since the last log, averaged over processes (each holds its share of the window)."""
        strategy, tr_loss = self.strategy, self.sums.read()  # a host sync follows anyway
        return strategy.reduce(tr_loss, "mean") if strategy.world_size > 1 else tr_loss

    @property
    def training_loss(self) -> float:
        """Mean loss per optimizer step over the whole run (HF ``TrainOutput.training_loss``)."""
        if self.manual:  # per batch (global_step counts each optimizer's steps)
            steps = self.windows - (self.windows_at_start if self.sums.loss_start_step else 0) - self.lossless_total
        else:
            steps = self.run.state.global_step - self.sums.loss_start_step - self.lossless_total
        return self.sums.total_loss / steps if steps > 0 and self.loss_seen else math.nan

    @property
    def has_loss(self) -> bool:
        """False for a manual-optimization run whose ``training_step`` returned no loss: there is no training
        loss to report (Lightning logs none)."""
        return self.loss_seen
