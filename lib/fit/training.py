"""The training stage of ``Fit`` (F-CORE-3): the body of one ``fit``/``train`` call on this process, read top-down
as arguments -> model and data -> the run's plan (steps, resume point) -> set-up (optimizers, strategy, restored
state) -> the fit loop -> the end-of-training metrics. Also what the loop calls back into during training: the
evaluation in HF's order, the best-metric record and writing a checkpoint. Mirrors HF ``Trainer.train`` /
``_inner_training_loop`` and Lightning's ``Trainer.fit``. An object owned by :class:`taskfit.Fit`; it calls the
Fit's public methods (``evaluate``, ``log``) through the Fit, so a subclass's overrides are what runs."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import torch
from torch import nn

from taskfit import efficiency
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.arguments.strategy_options import StrategyOptions
from taskfit.checkpoint.hook_dict import keep_added_keys, lightning_dict, loaded_lightning_dict, saved_epoch
from taskfit.checkpoint.writer import checkpoint_path, save_checkpoint
from taskfit.core.hook_logging import running
from taskfit.core.hooks import module_loader, overrides
from taskfit.core.module import infer_batch_size
from taskfit.core.results import ResultCollection
from taskfit.core.wrapping import ModelTaskModule
from taskfit.connector import configure_strategy
from taskfit.core.step_call import step_disabled
from taskfit.data.loaders import DataModule
from taskfit.debugging import fast_dev_run_batches, sanity_check
from taskfit.errors import configuration_error
from taskfit.fit.lightning_order import (
    given_value, late_run, late_training_start, loaders_late, rebuild_eval_loaders, rebuild_train_loader,
)
from taskfit.fit.hf_members import hf_parameter_count
from taskfit.fit.metric_checks import check_before_training, missing_metric_error
from taskfit.fit.run import Run
from taskfit.fit.signals import install_graceful_stop
from taskfit.fit.stage_hooks import end_stage, start_stage
from taskfit.fit.summary import log_summary
from taskfit.loggers import resume_loggers
from taskfit.loggers.logger import run_hyperparams
from taskfit.loops.evaluation_loop import metric_key
from taskfit.loops.fit_loop import FitLoop
from taskfit.loops.plan import accumulation_schedule, plan_steps, training_plan
from taskfit.loops.state import FitControl, FitState, TrainingState
from taskfit.metrics import TrainOutput, speed_metrics
from taskfit.seed import enable_full_determinism, rng_states, seed_everything, set_rng_states


@dataclasses.dataclass
class _Plan:
    """The non-restored plan of one training run: optimizer steps per epoch, in all, and epochs."""

    steps_per_epoch: int
    max_steps: int
    num_epochs: int
    reader: Any = None  # the resumed checkpoint's reader (planning opened it): restore reads each file once




class TrainingStage:
    """The body of ``Fit.fit`` on this process, and the loop's call-backs into the Fit.

    Args:
        fit (Fit): the owner.
    """

    def __init__(self, fit: Any) -> None:
        self.fit = fit

    def fit_stage(self, model: nn.Module | None, **kwargs: Any) -> TrainOutput:
        """One training, retried with a halved batch on out-of-memory under ``auto_find_batch_size``; global rank 0
        holds the ``output_dir`` run lock meanwhile (:mod:`taskfit.io.run_lock`: a second run on it is refused)."""
        from taskfit.io.run_lock import run_lock

        fit = self.fit
        with run_lock(fit.args.output_dir, enabled=fit.is_global_zero):
            if not fit.args.auto_find_batch_size:
                return self.fit_once(fit.args, model, **kwargs)
            return efficiency.fit_with_auto_batch_size(  # halve the batch on out-of-memory, retry
                lambda args: self.fit_once(args, model, **kwargs), fit.args, model, kwargs.get("train_data"),
                fit.strategy.accelerator)

    def fit_once(self, args: FitArguments, model: nn.Module | None, train_data: Any, eval_data: Any,
                 data_collator: Callable | None, datamodule: DataModule | None,
                 resume_from_checkpoint: str | bool | None, weights_only: bool) -> TrainOutput:
        """One training with ``args`` (see ``Fit.fit`` for the arguments, the result and the errors)."""
        fit = self.fit
        args, n_dev = self._arguments(args)
        if resume_from_checkpoint is None:
            resume_from_checkpoint = args.resume_from_checkpoint
        # seed first: model_init and the module's own initialisation must see the run's seed (HF order)
        (enable_full_determinism if args.full_determinism else seed_everything)(args.seed)
        model, module = fit._launcher.resolve_model(model, "fit")
        start_stage(fit, module, datamodule, "fit")  # configure_callbacks, prepare_data, setup, configure_model
        if loaders_late(fit, module):  # Lightning: the loaders are asked for in the sanity check and after it
            run, ckpt = late_run(self, args, model, module, datamodule, (train_data, eval_data, data_collator),
                                  resume_from_checkpoint, weights_only)
            plan = None
        else:
            run = self._loaded_run(args, model, module, datamodule, train_data, eval_data, data_collator)
            plan, ckpt = self._plan(run, args, resume_from_checkpoint, weights_only)
        self._setup(run, args, plan, ckpt, weights_only)
        hooks, ctl = fit._hooks, run.control
        if plan is not None:
            self._before_training(run, plan)
        ctl._new_training()
        if fit.is_global_zero and not n_dev and fit.loop_policy.logs_run_values:
            for lg in fit.loggers:
                lg.log_hyperparams(run_hyperparams(args.to_sanitized_dict(), module))
        hooks.call("on_fit_start", fit, module)
        module.zero_grad()  # Lightning clears the module's gradients as the stage starts
        if plan is not None:
            hooks.call_hf("on_train_begin", args, run.state, ctl, **run.hf_kwargs())
            prepare = functools.partial(given_value, plan)
        else:
            prepare = functools.partial(late_training_start, self, run, args, ckpt, weights_only)
        loop, start, plan, start_samples, start_step = self._train(run, args, prepare, ckpt, hooks)
        st = run.state
        metrics = speed_metrics("train", start, time.perf_counter(), st.samples_seen - start_samples,
                                st.global_step - start_step)
        return self._finish(run, args, datamodule, loop, metrics, hooks)

    def _loaded_run(self, args: FitArguments, model: nn.Module, module: Any, datamodule: DataModule | None,
                    train_data: Any, eval_data: Any, data_collator: Callable | None) -> Run:
        """The run with its loaders built now (HF's order: before the optimizers)."""
        fit = self.fit
        given, eval_given = train_data, eval_data is not None
        train_data, eval_data = self._data(args, module, datamodule, train_data, eval_data)
        run = self._new_run(args, model, module, train_data, eval_data, data_collator)
        run.reload_train_loader = functools.partial(rebuild_train_loader, fit, run, datamodule, module, given,
                                                    data_collator)
        if run.eval_loaders and not eval_given:
            run.reload_eval_loaders = functools.partial(rebuild_eval_loaders, fit, run, datamodule, module,
                                                        data_collator)
        return run

    def _before_training(self, run: Run, plan: _Plan) -> None:
        """Once the plan and the restored state are in: the eval loaders' epoch, the run summary."""
        run.eval_loaded_epoch = run.state.current_epoch  # the eval loaders were built for this epoch (resumed: its own)
        log_summary(self.fit, run.module, plan.max_steps, plan.steps_per_epoch, run.train_loader)

    def _arguments(self, args: FitArguments) -> tuple[FitArguments, int]:
        """The run's arguments (Lightning's ``fast_dev_run``: one short epoch of N batches, evaluated once at its
        end, no checkpoints), set on the Fit and its strategy; returns them and ``fast_dev_run``'s batches."""
        fit = self.fit
        n_dev = fast_dev_run_batches(args)
        if n_dev:
            args = dataclasses.replace(args, max_steps=math.ceil(n_dev / args.gradient_accumulation_steps),
                                       num_train_epochs=1, save_strategy="no", load_best_model_at_end=False,
                                       eval_strategy="epoch" if args.eval_strategy != "no" else "no")
        fit.args = args  # a retry or a trial brings new arguments: the strategy re-derives its settings too
        configure_strategy(fit.strategy, StrategyOptions.from_arguments(args))
        return args, n_dev

    def _data(self, args: FitArguments, module: Any, datamodule: DataModule | None, train_data: Any,
              eval_data: Any) -> tuple[Any, Any]:
        """The training and eval data (given, from the datamodule, or the module's own loaders), checked.

        Raises:
            ValueError: no training data; eval wanted without data; eval data for a module without
                ``validation_step``; manual optimization with accumulation or an engine that owns the step.
        """
        fit = self.fit
        can_validate = fit._stages.can_validate(module)
        # Lightning asks for the validation loader first when the sanity check will use it
        val_first = bool(args.num_sanity_val_steps) and args.limit_val_batches != 0
        # Lightning builds that loader inside the sanity check's isolated random state (see the policy)
        rng = rng_states() if val_first and fit.loop_policy.sanity_check_keeps_rng else None
        if datamodule is not None:
            if eval_data is None and val_first and not step_disabled(module, "validation_step"):
                eval_data = datamodule.val_dataloader()
            if rng is not None:
                set_rng_states(rng)
            train_data = train_data if train_data is not None else datamodule.train_dataloader()
            if eval_data is None and not val_first and not step_disabled(module, "validation_step"):
                eval_data = datamodule.val_dataloader()  # None: no val loop
        else:  # a LightningModule-style module may define its own loaders
            if eval_data is None and val_first and can_validate:
                eval_data = module_loader(module, "val_dataloader")
            if rng is not None:
                set_rng_states(rng)
            train_data = train_data if train_data is not None else module_loader(module, "train_dataloader")
            if eval_data is None and not val_first and can_validate:
                eval_data = module_loader(module, "val_dataloader")
        if train_data is None:
            raise ValueError("fit() needs training data: pass train_data (DataLoader or Dataset) or a datamodule.")
        if args.eval_strategy != "no" and eval_data is None:
            raise ValueError(f"eval_strategy={args.eval_strategy!r} needs eval data; pass eval_data or set "
                             "eval_strategy='no'.")
        if eval_data is not None and not can_validate:
            raise ValueError(f"{type(module).__name__} has no validation_step, but eval data was given.")
        self._check_manual(args, module)
        return train_data, eval_data

    def _check_manual(self, args: FitArguments, module: Any) -> None:
        """Refuse manual optimization with accumulation or an engine that owns the step (Lightning refuses
        these too), with a ValueError naming the setting."""
        if not module.automatic_optimization:
            if args.gradient_accumulation_steps > 1:
                raise ValueError(f"gradient_accumulation_steps={args.gradient_accumulation_steps} is not supported "
                                 "with manual optimization (automatic_optimization = False): accumulate in "
                                 "training_step by stepping the optimizers every N batches.")
            if self.fit.strategy.engine_owns_step:
                raise ValueError(f"manual optimization (automatic_optimization = False) is not supported by "
                                 f"{type(self.fit.strategy).__name__}, whose engine runs backward and the step.")

    def _new_run(self, args: FitArguments, model: nn.Module, module: Any, train_data: Any, eval_data: Any,
                 data_collator: Callable | None) -> Run:
        """The run of this training with its loaders (``get_train_dataloader`` of an HF subclass); a
        ``metric_for_best_model`` that can never be computed fails here, before any work."""
        fit = self.fit
        st = FitState(is_local_process_zero=fit.is_local_process_zero(), is_world_process_zero=fit.is_global_zero)
        run = Run("fit", model, module, st, FitControl())
        if train_data is not None:  # None: asked for later (LoopPolicy.loaders_after_setup)
            run.train_loader = fit._hf.train_dataloader(run, train_data, data_collator)
        run.eval_loaders = fit._launcher.eval_loader_dict(eval_data, data_collator, run=run)
        run.eval_data, run.data_collator = eval_data, data_collator
        if (run.eval_loaders and args.eval_strategy != "no" and args.metric_for_best_model
                and not fit._hf.overrides("evaluate")):  # an evaluate override may add the metric
            check_before_training(args.metric_for_best_model, metric_key(args.metric_for_best_model, "eval"),
                                  isinstance(module, ModelTaskModule), fit.compute_metrics is not None,
                                  list(run.eval_loaders) == [None])
        return run

    def _plan(self, run: Run, args: FitArguments, resume_from_checkpoint: str | bool | None,
              weights_only: bool) -> tuple[_Plan, str | None]:
        """The checkpoint this run resumes from (every rank takes rank 0's choice) and the steps of this run."""
        ckpt = self._checkpoint(args, resume_from_checkpoint)
        return self._steps(run, args, ckpt, weights_only), ckpt

    def _checkpoint(self, args: FitArguments, resume_from_checkpoint: str | bool | None) -> str | None:
        """The process group's environment set up, then the checkpoint this run resumes from (rank 0's choice)."""
        from taskfit.checkpoint.resume import resolve_checkpoint

        fit = self.fit
        fit.strategy.setup_environment()
        ckpt = resolve_checkpoint(fit.strategy.checkpoint_io, args.output_dir, resume_from_checkpoint)
        return fit.strategy.broadcast(ckpt)  # every rank resumes from rank 0's choice (a save may be racing)

    def _steps(self, run: Run, args: FitArguments, ckpt: str | None, weights_only: bool) -> _Plan:
        """The steps of this run from its train loader (re-counted for a resume from ``ckpt``); the state's
        intervals are set from them."""
        from taskfit.checkpoint.resume import plan_resumed_run

        fit, st = self.fit, run.state
        schedule = accumulation_schedule(fit.callbacks)
        steps_per_epoch, max_steps, num_epochs = plan_steps(run.train_loader, args, schedule)
        reader = None
        if ckpt:  # another number of steps per epoch than the checkpoint's run: the steps left are re-counted
            max_steps, num_epochs, reader = plan_resumed_run(
                fit.strategy.checkpoint_io, ckpt, run.train_loader, args, schedule,
                (steps_per_epoch, max_steps, num_epochs), weights_only)
        run.plan = training_plan(args, run.train_loader, (steps_per_epoch, max_steps, num_epochs),
                                 args.per_device_train_batch_size, st.is_local_process_zero, st.is_world_process_zero)
        return _Plan(steps_per_epoch, max_steps, num_epochs, reader)

    def _setup(self, run: Run, args: FitArguments, plan: _Plan | None, ckpt: str | None, weights_only: bool) -> None:
        """Optimizers and schedulers, the strategy's set-up, the state saved whole (restored from ``ckpt``), the
        ``push_to_hub`` publisher. The run becomes the Fit's current one. Without ``plan`` (loaders asked for
        later) a resume restores here only the weights and the callbacks (with ``on_load_checkpoint``), before
        ``configure_optimizers`` as Lightning; the rest after the plan."""
        from taskfit.checkpoint.hook_dict import restore_modules_and_callbacks
        from taskfit.checkpoint.publish import make_publisher
        from taskfit.optim.configure import configure_optimizers

        fit, module, st = self.fit, run.module, run.state
        max_steps = plan.max_steps if plan is not None else None
        run.flos_per_sample = 6 * sum(p.numel() for p in module.parameters())  # before sharding empties them
        run.flos_params = hf_parameter_count(run.model)  # HF counts tokens x non-embedding parameters
        run.flos_of = fit.floating_point_ops if run.flos_params is not None or fit._hf.overrides(
            "floating_point_ops") else None
        fit._run = run  # configure_optimizers may read self.trainer (estimated_stepping_batches...)
        if ckpt and plan is None:
            restore_modules_and_callbacks(run, ckpt, fit.strategy, fit.callbacks, fit._hooks, fit,
                                          args.restore_callback_states_from_checkpoint, weights_only)
        run.optimizers, run.schedulers = configure_optimizers(
            module, run.model, args, max_steps,
            fit._hf.run_optimizers(run, max_steps) or self._hf_optimizers(run.model),
            strategy_builds_optimizer=fit.strategy.builds_own_optimizer,
            none_trains_nothing=fit.loop_policy.none_optimizer_trains_nothing)
        fit._launcher.setup_run(run, max_steps)
        fit._run = fit._last_fit = run
        module._results = ResultCollection(infer_batch_size, fit.strategy.reduce)
        module._log_defaults = (True, False)
        run.training_state = TrainingState(
            st, run.control, run.sums, fit.strategy.precision, fit.callbacks, module, fit.strategy.all_gather,
            fit.global_rank, fit.world_size, args.restore_callback_states_from_checkpoint,
            accelerator=fit.strategy.accelerator)
        if ckpt and plan is not None:
            self._restore(run, args, plan, ckpt, weights_only)
        run.publisher = make_publisher(fit)  # push_to_hub: uploads on a background thread

    def _restore(self, run: Run, args: FitArguments, plan: _Plan, ckpt: str, weights_only: bool,
                 callbacks_restored: bool = False) -> None:
        """Restore ``ckpt`` into the set-up run and call ``on_load_checkpoint`` (unless the callbacks and the
        hooks had their turn before the optimizers: ``callbacks_restored``); the loggers continue from its step."""
        from taskfit.checkpoint.resume import restore

        fit, st = self.fit, run.state
        saved = restore(run, ckpt, fit.strategy, args, weights_only, plan.reader, callbacks_restored)
        epoch, limit = saved_epoch(saved), fit.loop_policy.max_epochs
        if not callbacks_restored:
            if fit.loop_policy.lightning_checkpoint_dict:
                saved = loaded_lightning_dict(run, fit.strategy.precision, saved)
            fit._hooks.call("on_load_checkpoint", fit, run.module, saved)
        if limit is not None and epoch > limit:  # the door's max_epochs: Lightning refuses a later checkpoint
            raise configuration_error(f"You restored a checkpoint with current_epoch={epoch}, but you have set "
                                      f"Trainer(max_epochs={limit}).")
        if fit.is_global_zero:  # every logger continues the same run from the checkpoint's step
            resume_loggers(fit.loggers, st.global_step, st.log_history)

    def _hf_optimizers(self, model: nn.Module) -> tuple[Any, Any]:
        """``optimizers=`` as given; else an optimizer from ``optimizer_cls_and_kwargs`` (HF's param groups)."""
        fit = self.fit
        opt, sched = fit._optimizers
        if opt is None and fit.optimizer_cls_and_kwargs is not None:
            from taskfit.optim.optimizers import _split_params

            cls, kwargs = fit.optimizer_cls_and_kwargs
            opt = cls(_split_params(model, float(fit.args.weight_decay)), **dict(kwargs))
        return opt, sched

    def _train(self, run: Run, args: FitArguments, prepare: Callable[[], _Plan], ckpt: str | None,
               hooks: Any) -> tuple[FitLoop, float, _Plan, int, int]:
        """Run the fit loop (sanity check, ``prepare()`` giving the plan, ``eval_on_start`` first) under the
        graceful-stop handlers; on any error the pending saves are waited for, ``on_exception`` runs and the
        loggers are finalised. Returns the loop, its start time (``time.perf_counter()``, s), the plan and the
        samples seen and ``global_step`` at the start."""
        from taskfit.checkpoint.resume import wait_for_saves_quietly

        fit = self.fit
        loop = FitLoop(run, fit, args, fit.strategy, hooks, lambda logs: fit.log(logs),
                       self.evaluate_during_fit, self.write_checkpoint, fit.loop_policy, fit._hf.hf_training_step(run))
        loop.stop = install_graceful_stop(  # SIGTERM / Ctrl-C / SLURM
            args.save_on_interrupt, fit.world_size, fit.strategy.check_collective)
        start = time.perf_counter()
        try:
            if args.num_sanity_val_steps and (run.eval_loaders or run.build_eval_loaders) and not ckpt:
                rng = rng_states(fit.strategy.accelerator) if fit.loop_policy.sanity_check_keeps_rng else None
                sanity_check(fit, run)  # between on_fit_start and on_train_start (Lightning)
                if rng is not None:
                    set_rng_states(rng, fit.strategy.accelerator)
            plan = prepare()
            start_samples, start_step = run.state.samples_seen, run.state.global_step
            if fit.loop_policy.max_epochs != 0:  # Lightning's max_epochs=0: no training loop, no train hooks
                run.module._log_defaults = (False, True)  # Lightning's self.log defaults in on_train_start
                hooks.call("on_train_start", fit, run.module)
                run.module._log_defaults = (True, False)
            if not (fit.loop_policy.keeps_submodule_modes and run.module.training):
                run.module.train()  # HF: the whole model trains (a PEFT base loaded in eval mode included)
            fit.is_in_train = True  # HF's flag: evaluate() called now evaluates inside this run
            if args.eval_on_start and run.eval_loaders:
                self.evaluate_during_fit(skip_scheduler=True)  # HF: no ReduceLROnPlateau step before training
            if args.detect_anomaly:
                with torch.autograd.detect_anomaly():
                    loop.run_epochs(run.train_loader, plan.steps_per_epoch, plan.num_epochs)
            else:
                loop.run_epochs(run.train_loader, plan.steps_per_epoch, plan.num_epochs)
            loop.stop.finish()  # the stop flag's last all-reduce: no collective left in flight after the loop
        except BaseException as exc:
            wait_for_saves_quietly(fit.strategy.checkpoint_io)
            hooks.call("on_exception", fit, run.module, exc)
            loop.teardown()  # the train loader's workers, after the exception hooks (Lightning)
            self.finalize_loggers("interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "failed")
            raise
        finally:
            loop.stop.uninstall()
            fit.is_in_train = False
        return loop, start, plan, start_samples, start_step

    def _finish(self, run: Run, args: FitArguments, datamodule: DataModule | None, loop: FitLoop,
                metrics: dict[str, Any], hooks: Any) -> TrainOutput:
        """The end of training: the metrics row (callbacks' train metrics, the best model, the final push), the
        end hooks in Lightning's and HF's order, the loggers finalised."""
        from taskfit.checkpoint.resume import finish_checkpoints

        fit, st, module = self.fit, run.state, run.module
        metrics.update(total_flos=float(st.total_flos))  # log() adds epoch
        if loop.has_loss:  # none for a manual-optimization run that returned no loss (Lightning logs none)
            metrics.update(train_loss=loop.training_loss)
        for cb in fit.callbacks:  # e.g. ThroughputMonitor: tokens/s, FLOP/s, MFU, memory deltas
            metrics.update(getattr(cb, "train_metrics", dict)())
        metrics.update(finish_checkpoints(fit, metrics, run.publisher))  # best model, final push
        fit.log(metrics)  # the same dict, as HF: a log() override that edits it edits the TrainOutput
        try:
            if fit.loop_policy.max_epochs != 0:
                hooks.call("on_train_end", fit, module)
            hooks.call_hf("on_train_end", args, st, run.control, **run.hf_kwargs())
            loop.teardown()  # the train loader's workers, between on_train_end and on_fit_end (Lightning)
            hooks.call("on_fit_end", fit, module)
        except Exception as exc:  # Lightning: on_exception covers the end hooks too (save_on_exception)
            hooks.call("on_exception", fit, module, exc)
            loop.teardown()
            self.finalize_loggers("failed")
            raise
        end_stage(fit, module, datamodule, "fit")
        self.finalize_loggers("success")
        return TrainOutput(st.global_step, loop.training_loss, metrics)

    def finalize_loggers(self, status: str) -> None:
        """``finalize(status)`` of every logger on rank zero."""
        if self.fit.is_global_zero:
            for lg in self.fit.loggers:
                lg.finalize(status)

    # ----------------------------------------------------------------------- called back during training ---
    def evaluate_during_fit(self, skip_scheduler: bool = False) -> dict[str, float]:
        """An evaluation during training, in HF's order: evaluate (log row, ``on_evaluate``), the metric
        schedulers' step, then the best metric. A subclass overriding ``evaluate`` or ``get_eval_dataloader`` is
        called here as HF's ``_maybe_log_save_evaluate`` calls it (``self.evaluate(ignore_keys=...)``).

        Raises:
            KeyError: a ``ReduceLROnPlateau`` monitor or ``metric_for_best_model`` the evaluation did not return.
        """
        fit = self.fit
        run = fit._run
        if run.reload_eval_loaders is not None and fit.loop_policy.reload_due(run.state.current_epoch,
                                                                              run.eval_loaded_epoch):
            run.reload_eval_loaders()
        if fit.loop_policy.zero_grad_before_validation or overrides(run.module, "on_validation_model_zero_grad"):
            with running(run.module, "on_validation_model_zero_grad"):
                run.module.on_validation_model_zero_grad()
        if fit._hf.overrides("get_eval_dataloader", "evaluate"):
            with fit._hf.loader_context(run, eval_dataset=run.eval_data, data_collator=run.data_collator):
                metrics = fit.evaluate(ignore_keys=fit._ignore_keys_for_eval)
        else:
            metrics = fit._stages.evaluate_in_run(run.eval_loaders, fit.loop_policy.eval_prefix,
                                                  fit._ignore_keys_for_eval)
        for cfg in () if skip_scheduler else run.schedulers:
            if cfg.interval != "eval":
                continue
            if cfg.monitor not in metrics:
                raise KeyError(f"ReduceLROnPlateau monitors {cfg.monitor!r}, which evaluation did not "
                               f"return; available: {sorted(metrics)}.")
            cfg.scheduler.step(metrics[cfg.monitor])
        self.track_best(metrics)
        return metrics

    def track_best(self, metrics: dict[str, float]) -> None:
        """Record ``metric_for_best_model``'s best value and step in the state (HF ``_determine_best_metric``).

        Raises:
            KeyError: the metric is not among ``metrics`` (naming close ones).
        """
        fit = self.fit
        name = fit.args.metric_for_best_model
        if not name:
            return
        key = metric_key(name, "eval")
        if key not in metrics:
            raise missing_metric_error(name, key, metrics)
        value, best = metrics[key], fit.state.best_metric
        greater = fit.args.greater_is_better if fit.args.greater_is_better is not None else not key.endswith("loss")
        if best is None or (value > best if greater else value < best):
            fit.state.best_metric = value
            if fit.args.save_strategy in ("steps", "epoch", "best"):  # HF: the step only when checkpoints exist
                fit.state.best_global_step = fit.state.global_step
            fit.control.should_save = fit.control.should_save or fit.args.save_strategy == "best"

    def write_checkpoint(self, training_state: dict[str, Any], path: str | None = None, run: Run | None = None) -> str:
        """Write a checkpoint of the current run: ``output_dir/checkpoint-{step}`` (recorded as the best one when
        this step holds the best metric, pushed with ``push_to_hub``) or, with ``path``, that folder (not pushed,
        not the HF best-model record). Calls ``on_save_checkpoint`` before and HF's ``on_save`` after. Returns the
        folder's path. ``run``: the run saved (default the current one)."""
        fit = self.fit
        run = run or fit._run
        if path is None and fit.state.best_global_step == fit.state.global_step:  # recorded before writing
            fit.state.best_model_checkpoint = checkpoint_path(fit)
            training_state["state"]["best_model_checkpoint"] = fit.state.best_model_checkpoint
        if fit.loop_policy.lightning_checkpoint_dict:  # Lightning's dict; the keys hooks add are kept
            hook_dict = lightning_dict(run, fit.strategy.precision, training_state, run.state.current_epoch,
                                       run.state.global_step)
            before = set(hook_dict)
            fit._hooks.call("on_save_checkpoint", fit, run.module, hook_dict)
            keep_added_keys(training_state, before, hook_dict)
        else:  # Lightning's keys for the hooks to read (kept elsewhere in the checkpoint, so not written twice)
            view = {"epoch": int(run.state.current_epoch), "global_step": run.state.global_step,
                    "lr_schedulers": [c.scheduler.state_dict() for c in run.schedulers or ()]}
            added = [k for k in view if k not in training_state]
            training_state.update({k: view[k] for k in added})
            fit._hooks.call("on_save_checkpoint", fit, run.module, training_state)
            for k in added:
                training_state.pop(k, None)
        written = save_checkpoint(fit, training_state, path)
        if path is None and run.publisher is not None:
            from taskfit.checkpoint.publish import push_checkpoint

            push_checkpoint(fit, run.publisher, written)
        fit._hooks.call_hf("on_save", fit.args, fit.state, fit.control)
        return written
