"""``Fit``: how to run a TaskModule (F-CORE-3). Holds the configuration: the strategy (and through it
accelerator, precision and checkpoint IO), callbacks, loggers and arguments; every ``fit``/``validate``/``test``/
``predict`` call works on a run of its own (:mod:`taskfit.fit.run`) driven by the loops. Mirrors Lightning's ``Trainer`` plus the HF
``Trainer`` API (``evaluate``, ``predict``, ``save_model``, ``log_metrics``, ``save_metrics``, ``compute_loss``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Callable

from lightning_utilities.core.rank_zero import rank_zero_only
import torch
from torch import nn

from taskfit.arguments.fit_arguments import FitArguments
from taskfit.callbacks.base import HookRunner
from taskfit.debugging import batch_limit, fast_dev_run_batches, limit_batches, sanity_check
from taskfit.callbacks.progress import ProgressBar
from taskfit.callbacks.throughput import with_throughput_monitor
from taskfit.checkpoint.writer import checkpoint_path
from taskfit.connector import configure_strategy, resolve_components
from taskfit.fit.hf_overrides import HFOverridePoints, default_collator, hf_overrides
from taskfit.fit.mixins import CallbackManagement, ProcessInfo, RunAttributes
from taskfit.fit.outputs import ModelOutputs
from taskfit.fit.stages import EvaluationStages
from taskfit.data.loaders import DataModule, build_dataloader, per_process_batch_size, floating_point_ops, forward_parameter_names, num_examples, num_tokens
from taskfit.loggers import Logger, build_loggers, resume_loggers, send_summary
from taskfit.loops.evaluation_loop import EvaluationLoop, is_loader_list, metric_key
from taskfit.loops.fit_loop import FitLoop, accumulation_schedule, plan_steps, resolve_interval
from taskfit.loops.state import FitControl, FitState, TrainingState
from taskfit.fit.metric_checks import check_before_training, missing_metric_error
from taskfit.metrics import TrainOutput, speed_metrics
from taskfit.core.module import TaskModule, infer_batch_size
from taskfit.core.hooks import module_loader
from taskfit.fit.stage_hooks import end_stage, start_stage
from taskfit.core.results import ResultCollection
from taskfit.fit.run import Run, RunLifecycle
from taskfit.callbacks.console import LogPrinter, configure_console
from taskfit.seed import enable_full_determinism, seed_everything
from taskfit.fit.signals import install_graceful_stop
from taskfit.fit.summary import log_summary
from taskfit.core.wrapping import ModelTaskModule, model_loss
from taskfit import efficiency

log = logging.getLogger("taskfit")
_COMPONENT_KEYS = ("accelerator", "strategy", "devices", "num_nodes", "precision")


class Fit(ProcessInfo, CallbackManagement, HFOverridePoints, RunAttributes, RunLifecycle, EvaluationStages,
          ModelOutputs):
    """Runs training, evaluation and prediction of a :class:`TaskModule` or a plain HF-style model.

    Args:
        args (FitArguments | dict | None): the options; every keyword of ``FitArguments`` may also be passed
            directly (``Fit(max_steps=10)``), overriding ``args``.
        accelerator (str | Accelerator | None): ``"cpu"``, ``"auto"``, ... (F-ACC-1).
        strategy (str | Strategy | None): ``"auto"``, ``"single_device"``, ``"ddp"``, ``"fsdp"``, ... (F-STRAT).
        devices (int | str | list[int] | None): devices/processes (``"auto"``, a count, indices, ``-1``).
        num_nodes (int | None): machines.
        precision (str | Precision | None): ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"64-true"``...
        callbacks (list[Callback] | None): observers (``Callback`` or HF ``TrainerCallback`` objects).
        loggers (list[Logger] | None): metric sinks in addition to those named by ``report_to``.
        plugins (list | None): ``Precision`` / ``CheckpointIO`` instances.
        compute_metrics (Callable[[EvalPrediction], dict] | None): HF-style metric function.
        preprocess_logits_for_metrics (Callable[[Tensor, Tensor], Tensor] | None): applied per batch.
        compute_loss_func (Callable[[outputs, labels, num_items_in_batch], Tensor] | None): custom loss for
            plain models (HF ``compute_loss_func``); subclassing ``Fit`` and overriding :meth:`compute_loss`
            works too.
        optimizers (tuple[Optimizer | None, LRScheduler | None]): HF-style pre-built optimizer/scheduler.
        data_collator (Callable | None): default collator for datasets; None gives HF's default, kept in
            ``fit.data_collator``: ``DataCollatorWithPadding(processing_class)`` for a tokenizer or feature
            extractor, else :func:`~taskfit.data.loaders.default_collate_with_labels` (HF
            ``default_data_collator``'s renaming of ``label``/``label_ids``, plus tuple samples).
        processing_class (Any | None): tokenizer/processor saved with the model (``tokenizer`` is an alias);
            with a tokenizer and no collator, batches are padded with ``DataCollatorWithPadding``.
        model_init (Callable[[], nn.Module] | None): builds a fresh model when ``fit`` gets none.
        model (nn.Module | None): the model ``fit``/``train`` uses when none is passed (HF ``Trainer(model=...)``).
        train_dataset, eval_dataset (Any): the data ``fit``/``train`` and ``evaluate`` use when none is passed
            (HF ``Trainer(train_dataset=..., eval_dataset=...)``).
        optimizer_cls_and_kwargs (tuple[type, dict] | None): an optimizer class and its keyword arguments, built
            over the decay / no-decay parameter groups (``weight_decay`` from ``args``), as HF's argument of that
            name; ``optimizers=`` wins when both are given.

    With these keywords ``Fit(model=m, args=a, train_dataset=d).train()`` is the HF ``Trainer`` call shape;
    ``taskfit.hf.Trainer`` only adds HF's positional order.

    Raises:
        ValueError: unknown option names or values (with "did you mean"), incompatible components.
        NotImplementedError: an option or component whose feature has not landed yet (names the issue).
    """

    def __init__(self, args: FitArguments | dict | None = None, *, accelerator: Any = None, strategy: Any = None,
                 devices: Any = None, num_nodes: int | None = None, precision: Any = None,
                 callbacks: list[Any] | None = None, loggers: list[Logger] | None = None,
                 plugins: list[Any] | None = None, compute_metrics: Callable | None = None,
                 preprocess_logits_for_metrics: Callable | None = None, compute_loss_func: Callable | None = None,
                 optimizers: tuple[Any, Any] = (None, None), data_collator: Callable | None = None,
                 processing_class: Any = None, tokenizer: Any = None, model_init: Callable | None = None,
                 model: nn.Module | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None, **kwargs: Any) -> None:
        if args is None:
            args = FitArguments()
        elif isinstance(args, Mapping):
            args = FitArguments.from_dict(dict(args))
        elif not isinstance(args, FitArguments):
            raise TypeError(f"args must be FitArguments, a dict or None; got {type(args).__name__}.")
        plugins = list(plugins or [])
        instances: dict[str, Any] = {}
        overrides = dict(kwargs)
        for key, value in zip(_COMPONENT_KEYS, (accelerator, strategy, devices, num_nodes, precision)):
            if value is None:
                continue
            if isinstance(value, (str, int, list, tuple)):
                overrides[key] = list(value) if isinstance(value, tuple) else value
            elif key == "precision":
                plugins.append(value)
            else:
                instances[key] = value
        if overrides:
            args = args.replace(**overrides)
        self.args = args
        self.strategy = resolve_components(args, plugins, **instances)
        rank_zero_only.rank = self.strategy.global_rank  # one rank-zero gate for every side effect
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.compute_loss_func = compute_loss_func
        self._optimizers = optimizers
        self.processing_class = processing_class if processing_class is not None else tokenizer
        self.data_collator = default_collator(data_collator, self.processing_class)  # as HF: never None
        self.model_init = model_init
        self._model_preparation_time: float | None = None
        self._given_model = model
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self.is_in_train = False  # True while fit() trains (HF's flag; evaluate() then runs inside that run)
        self._ignore_keys_for_eval: list[str] | None = None
        self._creating: list[Any] | None = None  # the optimizer/scheduler slots while create_optimizer runs
        self._loader_run: Run | None = None  # the run whose loaders an HF get_*_dataloader override builds

        self.callbacks: list[Any] = with_throughput_monitor(args, list(callbacks or []))
        if args.profiler:  # a callback: a run without a profiler pays nothing for it
            from taskfit.callbacks.profilers import profiler_from_args

            self.callbacks.append(profiler_from_args(args))
        if any(isinstance(cb, ProgressBar) for cb in self.callbacks):
            pass  # the user's bar (tqdm or rich) replaces the default console view, as in Lightning
        elif args.disable_tqdm:  # the console view: one line per log, or the bar
            self.callbacks.append(LogPrinter())
        else:
            self.callbacks.insert(0, ProgressBar())
        efficiency.check_run(self)  # tf32, compile/checkpointing options, label smoothing, NEFTune
        self.loggers: list[Logger] = build_loggers(args, loggers)
        self._idle_state = FitState(is_local_process_zero=self.strategy.local_rank == 0,
                                    is_world_process_zero=self.strategy.is_global_zero)
        self._idle_control = FitControl()
        self._run: Run | None = None       # the run of the latest stage call (see taskfit.fit.run)
        self._last_fit: Run | None = None  # the run of the latest fit()
        self.callback_metrics: dict[str, Any] = {}
        self.sanity_checking = False  # True while num_sanity_val_steps runs (Lightning's trainer.sanity_checking)
        self.logged_metrics: dict[str, Any] = {}
        self.num_eval_batches: int | None = None
        self._hooks = HookRunner(self.callbacks)
        configure_console(args, self.strategy)  # log_level on main processes, log_level_replica elsewhere
        self._hooks.call_hf("on_init_end", args, self.state, self.control)

    @property
    def scheduler_monitor(self) -> str | None:
        """The metric the first (metric) scheduler watches, if any."""
        configs = self.lr_scheduler_configs
        return configs[0].monitor if configs else None

    def _collator(self, data_collator: Callable | None) -> Callable | None:
        collator = data_collator or self.data_collator
        if collator is None and self.processing_class is not None and hasattr(self.processing_class, "pad"):
            from transformers import DataCollatorWithPadding

            collator = DataCollatorWithPadding(self.processing_class)
        return collator

    def _loader(self, data: Any, *, train: bool, collator: Callable | None, what: str,
                run: Run | None = None) -> Any:
        run = run or self._run
        keep = None
        if run is not None and isinstance(run.module, ModelTaskModule) and self.args.remove_unused_columns:
            names = forward_parameter_names(run.model)
            if names is not None:
                keep = names | set(run.module.label_names) | {"label", "label_ids"}
        bs = per_process_batch_size(self.args, self.world_size, train)  # split_batches: global size / world
        a = self.args
        stage = run.stage if run is not None else "fit"
        loader = self.strategy.process_dataloader(
            build_dataloader(data, a, train=train and not (a.overfit_batches and stage == "fit"), batch_size=bs,
                             collate_fn=self._collator(collator), keep_columns=keep, what=what,
                             pin_memory_supported=self.strategy.accelerator.supports_pin_memory()))
        limit = batch_limit(a, stage, train)
        if limit is not None:  # Lightning's fast_dev_run / overfit_batches / limit_*_batches
            loader = limit_batches(loader, limit, "limit_train_batches" if train else f"limit for {what}")
        return loader

    def _eval_loader_dict(self, data: Any, collator: Callable | None, run: Run | None = None) -> dict[str | None, Any]:
        if data is None:
            return {}
        if isinstance(data, Mapping):
            return {name: self._loader(d, train=False, collator=collator, what=f"eval dataset {name!r}", run=run)
                    for name, d in data.items()}
        if is_loader_list(data):  # Lightning's list of loaders: keyed by dataloader_idx
            if len(data) == 1:
                data = data[0]
            else:
                return {i: self._loader(d, train=False, collator=collator, what=f"eval dataset {i}", run=run)
                        for i, d in enumerate(data)}
        return {None: self._loader(data, train=False, collator=collator, what="eval dataset", run=run)}

    # ----------------------------------------------------------------------------------------- fitting ---
    def fit(self, model: nn.Module | None = None, train_data: Any = None, eval_data: Any = None, *,
            data_collator: Callable | None = None, datamodule: DataModule | None = None,
            resume_from_checkpoint: str | bool | None = None, weights_only: bool = True) -> TrainOutput:
        """Train ``model`` on ``train_data`` (a DataLoader, a Dataset, or ``datamodule``), evaluating on
        ``eval_data`` (one dataset/loader or a dict of named ones) as ``eval_strategy`` says. Without ``model``,
        ``model_init()`` builds a fresh one (every call), else the last run's model continues.

        ``resume_from_checkpoint`` (default ``args.resume_from_checkpoint``): ``True``/``"last"``/``"auto"`` continues
        from the newest complete checkpoint in ``output_dir`` (from scratch when there is none), a path or URL from
        that checkpoint (a ``transformers.Trainer`` checkpoint folder too); nothing given means ``"auto"`` after an
        elastic restart (torchrun ``--max-restarts``, SLURM requeue); the run then ends exactly as one that never stopped (see :mod:`taskfit.checkpoint.resume`).
        ``weights_only=False`` allows checkpoint files that need full unpickling (only for trusted files).

        Returns:
            TrainOutput: ``train_runtime`` (s), ``train_samples_per_second``, ``train_steps_per_second``,
            ``total_flos`` (6 x parameters x samples), ``train_loss``, ``epoch``; with ``load_best_model_at_end``
            also ``best_global_step``, ``best_metric``, ``best_model_checkpoint``.

        Raises:
            ValueError: no or empty training data; evaluation requested without eval data or step; more optimizers
                than the strategy supports.
            TypeError: data of the wrong type; a training_step returning something other than a loss.
            CheckpointError: the checkpoint to resume from is incomplete, corrupted or incompatible.
            UnsafeCheckpointError: a checkpoint file needs full unpickling and ``weights_only`` is True.
            CheckpointSaveError: a background (async) checkpoint save failed.
        """
        if datamodule is None:
            train_data = train_data if train_data is not None else self.train_dataset
            eval_data = eval_data if eval_data is not None else self.eval_dataset
        return self._launch("fit", model, dict(train_data=train_data, eval_data=eval_data,
                                               data_collator=data_collator, datamodule=datamodule,
                                               resume_from_checkpoint=resume_from_checkpoint,
                                               weights_only=weights_only))

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """HF ``Trainer.train``: :meth:`fit` on the constructor's ``model`` (or a fresh ``model_init()``),
        ``train_dataset`` and ``eval_dataset``.

        Args:
            resume_from_checkpoint (str | bool | None): as in :meth:`fit`.
            trial (optuna.Trial | dict | None): hyperparameters of a search trial; a dict's entries (or an optuna
                trial's ``params``) are set on ``args`` for this training, as HF does.
            ignore_keys_for_eval (list[str] | None): output keys the evaluations during this training leave out of
                the predictions (given to ``evaluate``/``prediction_step`` as ``ignore_keys``).

        Raises:
            TypeError: an unknown keyword (HF raises the same for leftovers).
        """
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {', '.join(sorted(kwargs))}.")
        if trial is not None:
            params = trial if isinstance(trial, Mapping) else getattr(trial, "params", {})
            if params:
                self.args = self.args.replace(**dict(params))
        self._ignore_keys_for_eval = ignore_keys_for_eval
        return self.fit(resume_from_checkpoint=resume_from_checkpoint)

    def _hf_optimizers(self, model: nn.Module) -> tuple[Any, Any]:
        """``optimizers=`` as given; else an optimizer from ``optimizer_cls_and_kwargs`` (HF's param groups)."""
        opt, sched = self._optimizers
        if opt is None and self.optimizer_cls_and_kwargs is not None:
            from taskfit.optim.optimizers import _split_params

            cls, kwargs = self.optimizer_cls_and_kwargs
            opt = cls(_split_params(model, float(self.args.weight_decay)), **dict(kwargs))
        return opt, sched

    def _fit_stage(self, model: nn.Module | None, **kwargs: Any) -> TrainOutput:
        if not self.args.auto_find_batch_size:
            return self._fit_once(self.args, model, **kwargs)
        return efficiency.fit_with_auto_batch_size(  # halve the batch on out-of-memory, retry
            lambda args: self._fit_once(args, model, **kwargs), self.args, model, kwargs.get("train_data"),
            self.strategy.accelerator)

    def _fit_once(self, args: FitArguments, model: nn.Module | None, train_data: Any, eval_data: Any,
                  data_collator: Callable | None, datamodule: DataModule | None,
                  resume_from_checkpoint: str | bool | None, weights_only: bool) -> TrainOutput:
        from taskfit.optim.configure import configure_optimizers
        from taskfit.checkpoint.publish import make_publisher
        from taskfit.checkpoint.resume import (
            finish_checkpoints, plan_resumed_run, resolve_checkpoint, restore, wait_for_saves_quietly,
        )

        n_dev = fast_dev_run_batches(args)
        if n_dev:  # one short epoch of N batches, evaluated once at its end, no checkpoints (Lightning)
            args = dataclasses.replace(args, max_steps=math.ceil(n_dev / args.gradient_accumulation_steps),
                                       num_train_epochs=1, save_strategy="no", load_best_model_at_end=False,
                                       eval_strategy="epoch" if args.eval_strategy != "no" else "no")
        self.args = args  # a retry or a trial brings new arguments: the strategy re-derives its settings too
        configure_strategy(self.strategy, args)
        if resume_from_checkpoint is None:
            resume_from_checkpoint = args.resume_from_checkpoint
        # seed first: model_init and the module's own initialisation must see the run's seed (HF order)
        (enable_full_determinism if args.full_determinism else seed_everything)(args.seed)
        model, module = self._resolve_model(model, "fit")
        start_stage(self, module, datamodule, "fit")  # configure_callbacks, prepare_data, setup, configure_model
        if datamodule is not None:
            train_data = train_data if train_data is not None else datamodule.train_dataloader()
            eval_data = eval_data if eval_data is not None else datamodule.val_dataloader()
        else:  # a LightningModule-style module may define its own loaders
            train_data = train_data if train_data is not None else module_loader(module, "train_dataloader")
            if eval_data is None and self._can_validate(module):
                eval_data = module_loader(module, "val_dataloader")
        if train_data is None:
            raise ValueError("fit() needs training data: pass train_data (DataLoader or Dataset) or a datamodule.")
        if args.eval_strategy != "no" and eval_data is None:
            raise ValueError(f"eval_strategy={args.eval_strategy!r} needs eval data; pass eval_data or set "
                             "eval_strategy='no'.")
        if eval_data is not None and not self._can_validate(module):
            raise ValueError(f"{type(module).__name__} has no validation_step, but eval data was given.")
        if not module.automatic_optimization:  # Lightning refuses these too
            if args.gradient_accumulation_steps > 1:
                raise ValueError(f"gradient_accumulation_steps={args.gradient_accumulation_steps} is not supported "
                                 "with manual optimization (automatic_optimization = False): accumulate in "
                                 "training_step by stepping the optimizers every N batches.")
            if self.strategy.engine_owns_step:
                raise ValueError(f"manual optimization (automatic_optimization = False) is not supported by "
                                 f"{type(self.strategy).__name__}, whose engine runs backward and the step.")
        st = FitState(is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_global_zero)
        run = Run("fit", model, module, st, FitControl())
        run.train_loader = self._train_dataloader(run, train_data, data_collator)  # get_train_dataloader (HF)
        run.eval_loaders = self._eval_loader_dict(eval_data, data_collator, run=run)
        run.eval_data, run.data_collator = eval_data, data_collator
        if (run.eval_loaders and args.eval_strategy != "no" and args.metric_for_best_model
                and type(self).evaluate is EvaluationStages.evaluate):  # an evaluate override may add the metric
            check_before_training(args.metric_for_best_model, metric_key(args.metric_for_best_model, "eval"),
                                  isinstance(module, ModelTaskModule), self.compute_metrics is not None,
                                  list(run.eval_loaders) == [None])

        schedule = accumulation_schedule(self.callbacks)
        steps_per_epoch, max_steps, num_epochs = plan_steps(run.train_loader, args, schedule)
        self.strategy.setup_environment()
        ckpt = resolve_checkpoint(self.strategy.checkpoint_io, args.output_dir, resume_from_checkpoint)
        ckpt = self.strategy.broadcast(ckpt)  # every rank resumes from rank 0's choice (a save may be racing)
        if ckpt:  # another number of steps per epoch than the checkpoint's run: the steps left are re-counted
            max_steps, num_epochs = plan_resumed_run(self.strategy, ckpt, run.train_loader, args,
                                                     schedule, (steps_per_epoch, max_steps, num_epochs), weights_only)
        st.max_steps, st.num_train_epochs = max_steps, (num_epochs if steps_per_epoch else 0)
        st.logging_steps = resolve_interval(args.logging_steps, max_steps)
        st.eval_steps = resolve_interval(args.eval_steps if args.eval_steps is not None else args.logging_steps,
                                         max_steps)
        st.save_steps = resolve_interval(args.save_steps, max_steps)
        st.train_batch_size = args.per_device_train_batch_size
        st.batches_per_epoch = steps_per_epoch and len(run.train_loader)

        run.flos_per_sample = 6 * sum(p.numel() for p in module.parameters())  # before sharding empties them
        self._run = run  # configure_optimizers may read self.trainer (estimated_stepping_batches...)
        run.optimizers, run.schedulers = configure_optimizers(
            module, model, args, max_steps, self._run_optimizers(run, max_steps) or self._hf_optimizers(model),
            strategy_builds_optimizer=self.strategy.builds_own_optimizer)
        self._setup_run(run, max_steps)
        self._run = self._last_fit = run
        module._results = ResultCollection(infer_batch_size, self.strategy.reduce)
        module._log_defaults = (True, False)
        run.training_state = TrainingState(
            st, run.control, run.sums, self.strategy.precision, self.callbacks, module, self.strategy.all_gather,
            self.global_rank, self.world_size, args.restore_callback_states_from_checkpoint,
            accelerator=self.strategy.accelerator)
        if ckpt:
            saved = restore(run, ckpt, self.strategy, args, weights_only)
            self._hooks.call("on_load_checkpoint", self, module, saved)
            if self.is_global_zero:  # every logger continues the same run from the checkpoint's step
                resume_loggers(self.loggers, st.global_step, st.log_history)
        run.publisher = make_publisher(self)  # push_to_hub: uploads on a background thread
        start_samples, start_step = st.samples_seen, st.global_step
        log_summary(self, module, max_steps, steps_per_epoch)
        hooks, ctl = self._hooks, run.control
        ctl._new_training()
        if self.is_global_zero and not n_dev:
            for lg in self.loggers:
                lg.log_hyperparams(args.to_sanitized_dict())
        hooks.call("on_fit_start", self, module)
        hooks.call_hf("on_train_begin", args, st, ctl, **run.hf_kwargs())
        hooks.call("on_train_start", self, module)
        module.train()
        loop = FitLoop(run, self, args, self.strategy, hooks, self._log, self._evaluate_during_fit,
                       self._save_checkpoint)
        loop.stop = install_graceful_stop(  # SIGTERM / Ctrl-C / SLURM
            args.save_on_interrupt, self.world_size, getattr(self.strategy, "check_collective", None))
        start = time.perf_counter()
        try:
            if args.num_sanity_val_steps and run.eval_loaders and not ckpt:
                sanity_check(self, run)
            self.is_in_train = True  # HF's flag: evaluate() called now evaluates inside this run
            if args.eval_on_start and run.eval_loaders:
                self._evaluate_during_fit(skip_scheduler=True)  # HF: no ReduceLROnPlateau step before training
            if args.detect_anomaly:
                with torch.autograd.detect_anomaly():
                    loop.run_epochs(run.train_loader, steps_per_epoch, num_epochs)
            else:
                loop.run_epochs(run.train_loader, steps_per_epoch, num_epochs)
            loop.stop.finish()  # the stop flag's last all-reduce: no collective left in flight after the loop
        except BaseException as exc:
            wait_for_saves_quietly(self.strategy.checkpoint_io)
            hooks.call("on_exception", self, module, exc)
            self._finalize_loggers("interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "failed")
            raise
        finally:
            loop.stop.uninstall()
            self.is_in_train = False
        metrics = speed_metrics("train", start, time.perf_counter(), st.samples_seen - start_samples,
                                st.global_step - start_step)
        metrics.update(total_flos=float(st.total_flos), train_loss=loop.training_loss)  # log() adds epoch
        for cb in self.callbacks:  # e.g. ThroughputMonitor: tokens/s, FLOP/s, MFU, memory deltas
            metrics.update(getattr(cb, "train_metrics", dict)())
        metrics.update(finish_checkpoints(self, metrics, run.publisher))  # best model, final push
        self._log(metrics)  # the same dict, as HF: a log() override that edits it edits the TrainOutput
        hooks.call("on_train_end", self, module)
        hooks.call_hf("on_train_end", args, st, ctl, **run.hf_kwargs())
        hooks.call("on_fit_end", self, module)
        end_stage(self, module, datamodule, "fit")
        self._finalize_loggers("success")
        return TrainOutput(st.global_step, loop.training_loss, metrics)

    @staticmethod
    def _can_validate(module: TaskModule) -> bool:
        return type(module).validation_step is not TaskModule.validation_step

    def _finalize_loggers(self, status: str) -> None:
        if self.is_global_zero:
            for lg in self.loggers:
                lg.finalize(status)

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """Send ``logs`` to every logger and ``on_log`` callbacks; append to ``state.log_history`` with the
        current ``step`` (and ``epoch`` unless given). Mirrors HF ``Trainer.log`` (``start_time`` is accepted for
        its signature). The end-of-run summary (the row with ``train_runtime``, as HF's printer tells it apart)
        goes to the loggers' summary, apart from the per-step names."""
        summary = "train_runtime" in logs
        st = self.state
        logs.setdefault("epoch", st.epoch)  # unrounded, as HF 5
        st.log_history.append({**logs, "step": st.global_step})
        self.logged_metrics.update(logs)
        self.callback_metrics.update(logs)
        if self.is_global_zero and not self.args.fast_dev_run:  # fast_dev_run: no loggers (Lightning)
            if summary:
                send_summary(self.loggers, logs, st.global_step)
            for lg in self.loggers if not summary else ():
                lg.log_metrics(logs, st.global_step)
        if self._hooks.hf["on_log"]:
            self._hooks.call_hf("on_log", self.args, st, self.control, logs=logs)

    def _run_eval(self, loaders: dict[str | None, Any], stage: str, prefix: str,
                  ignore_keys: list[str] | None = None) -> tuple[dict, set[str]]:
        """Evaluate every named loader; returns the metrics and the keys logged with ``logger=False``."""
        metrics: dict[str, float] = {}
        hidden: set[str] = set()
        indexed = len(loaders) > 1 and all(isinstance(n, int) for n in loaders)  # a list: one evaluation epoch
        shared = ResultCollection(infer_batch_size, self.strategy.reduce, sync_by_default=True) if indexed else None
        for i, (name, loader) in enumerate(loaders.items()):
            loop = EvaluationLoop(self, stage, self._hooks, ignore_keys, **(dict(
                dataloader_idx=name, results=shared, first=i == 0, last=i == len(loaders) - 1) if indexed else {}))
            key = prefix if name is None or indexed else f"{prefix}_{name}"
            metrics.update(loop.run(loader, key)[0])
            if self._model_preparation_time is not None:
                metrics[f"{key}_model_preparation_time"] = self._model_preparation_time
            hidden |= loop.hidden
        return metrics, hidden

    def _evaluate_during_fit(self, skip_scheduler: bool = False) -> dict[str, float]:
        """An evaluation during training, in HF's order: evaluate (log row, ``on_evaluate``), the metric
        schedulers' step, then the best metric. A subclass overriding ``evaluate`` or ``get_eval_dataloader`` is
        called here as HF's ``_maybe_log_save_evaluate`` calls it (``self.evaluate(ignore_keys=...)``)."""
        run = self._run
        if hf_overrides(self, "get_eval_dataloader") or type(self).evaluate is not EvaluationStages.evaluate:
            with self._loader_context(run, eval_dataset=run.eval_data, data_collator=run.data_collator):
                metrics = self.evaluate(ignore_keys=self._ignore_keys_for_eval)
        else:
            metrics = self._evaluate_in_run(run.eval_loaders, "eval", self._ignore_keys_for_eval)
        for cfg in () if skip_scheduler else run.schedulers:
            if cfg.interval != "eval":
                continue
            if cfg.monitor not in metrics:
                raise KeyError(f"ReduceLROnPlateau monitors {cfg.monitor!r}, which evaluation did not "
                               f"return; available: {sorted(metrics)}.")
            cfg.scheduler.step(metrics[cfg.monitor])
        self._track_best(metrics)
        return metrics

    def _track_best(self, metrics: dict[str, float]) -> None:
        name = self.args.metric_for_best_model
        if not name:
            return
        key = metric_key(name, "eval")
        if key not in metrics:
            raise missing_metric_error(name, key, metrics)
        value, best = metrics[key], self.state.best_metric
        greater = self.args.greater_is_better if self.args.greater_is_better is not None else not key.endswith("loss")
        if best is None or (value > best if greater else value < best):
            self.state.best_metric = value
            if self.args.save_strategy in ("steps", "epoch", "best"):  # HF: the step only when checkpoints exist
                self.state.best_global_step = self.state.global_step
            self.control.should_save = self.control.should_save or self.args.save_strategy == "best"

    def _save_checkpoint(self, training_state: dict[str, Any], path: str | None = None) -> str:
        """Write a checkpoint of the current run: ``output_dir/checkpoint-{step}`` or, with ``path``, that folder
        (``ModelCheckpoint``; not pushed, not the HF best-model record). Returns the folder's path."""
        run = self._run
        if path is None and self.state.best_global_step == self.state.global_step:  # recorded before writing
            self.state.best_model_checkpoint = checkpoint_path(self)
            training_state["state"]["best_model_checkpoint"] = self.state.best_model_checkpoint
        self._hooks.call("on_save_checkpoint", self, run.module, training_state)
        written = self.strategy.save_checkpoint(self, training_state, path)
        if path is None and run.publisher is not None:
            from taskfit.checkpoint.publish import push_checkpoint

            push_checkpoint(self, run.publisher, written)
        self._hooks.call_hf("on_save", self.args, self.state, self.control)
        return written

    def _log(self, logs: dict[str, Any]) -> None:
        self.log(logs)  # through self: a subclass's log() override sees every row, as in HF

    def hyperparameter_search(self, hp_space: Callable | None = None, compute_objective: Callable | None = None,
                              n_trials: int = 20, direction: Any = "minimize", **kw: Any) -> Any:
        """Optuna search returning ``BestRun`` (F-HPO-1, HF ``Trainer.hyperparameter_search``); arguments
        (``backend``, ``train_data``, ``model_init``...): :func:`taskfit.fit.hpo.hyperparameter_search`."""
        from taskfit.fit.hpo import hyperparameter_search

        runs = self._run, self._last_fit  # every trial is a run of its own; afterwards the Fit is as before
        try:
            return hyperparameter_search(self, hp_space, compute_objective, n_trials, direction, **kw)
        finally:
            self._run, self._last_fit = runs

    # ---------------------------------------------------------------------------------- loss / output ---
    def compute_loss(self, model: nn.Module, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: int | None = None) -> Any:
        """Loss of a plain model on ``inputs`` (mirrors HF ``Trainer.compute_loss``; override it in a subclass
        for a custom loss, e.g. class weights). With ``compute_loss_func`` the labels are taken out of the
        batch and passed to it with the outputs.

        Raises:
            ValueError: the model returned no loss or a non-scalar one (no labels in the batch?).
        """
        return model_loss(self, model, inputs, return_outputs, num_items_in_batch)

    # ------------------------------------------------------------------------------------ data helpers ---
    num_examples = staticmethod(num_examples)
    num_tokens = staticmethod(num_tokens)

    def floating_point_ops(self, inputs: Any) -> int:
        """Training FLOPs of one batch (see :func:`taskfit.data.loaders.floating_point_ops`)."""
        return floating_point_ops(self.model or nn.Module(), inputs)
