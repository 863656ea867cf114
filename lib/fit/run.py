"""The run object: what one ``Fit.fit``/``validate``/``test``/``predict`` call works on.

``Fit`` holds configuration (arguments, callbacks, loggers, the resolved strategy); every call builds a
:class:`Run` that owns the model, the module, the optimizers and schedulers the strategy returned from
``setup``, the loaders, the loop state and the resume point. Nothing of one run leaks into the next, so calling
``fit`` twice, ``auto_find_batch_size`` retries and hyperparameter-search trials start clean by construction.
``Fit``'s HF-style attributes (``fit.model``, ``fit.optimizer``, ``fit.state``...) read the current (or last) run;
``fit.run`` is the run of the call in progress. :class:`RunLauncher` (owned by ``Fit``) starts the calls and sets
their runs up.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import nn

from taskfit.core.quantized import check_quantized_setup, check_quantized_training
from taskfit.data.combined import combined_train_loader, is_loader_collection
from taskfit.data.loaders import build_dataloader, forward_parameter_names, per_process_batch_size, sequential_loader
from taskfit.data.shuffled_split import shuffled_split_loader
from taskfit.debugging import batch_limit, limit_batches
from taskfit.loops.evaluation_loop import is_loader_list
from taskfit.loops.plan import RunPlan
from taskfit.loops.state import FitControl, FitState, LossSums, TrainingState
from taskfit.redact import redact_exception
from taskfit.core.module import TaskModule
from taskfit.core.wrapping import ModelTaskModule

log = logging.getLogger("taskfit")


@dataclass(eq=False)
class Run:
    """One stage's objects.

    Attributes:
        stage (str): ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        model (nn.Module): the user's model (a TaskModule, or the plain model a ``ModelTaskModule`` wraps).
        module (TaskModule): what the loops drive.
        state (FitState), control (FitControl): the loop state and flags (evaluation stages share the last
            ``fit``'s, so their log rows join its history, as in HF).
        plan (RunPlan): the run's plan (a property: kept in ``state.plan``, see :class:`~taskfit.loops.plan.RunPlan`).
        wrapped (nn.Module | None): what ``Strategy.setup`` returned for ``module`` (DDP/FSDP wrapper, engine).
        optimizers (list[Optimizer]): as returned by ``Strategy.setup`` (several step together each window).
        schedulers (list[SchedulerConfig]): their schedules with step interval and monitored metric.
        train_loader (Any), eval_loaders (dict[str | None, Any]): the run's loaders.
        sums (LossSums): the fit loop's running loss sums.
        training_state (TrainingState | None): the state saved and restored whole (``fit`` only).
        resume_from (str | None): the checkpoint this run continues (restored before the loop starts).
        start_step (int): ``global_step`` at the start (after a restore).
        flos_per_sample (int): training FLOPs per sample (6 x parameters), for models HF cannot count.
        flos_of (Callable[[Any], float] | None): a micro-batch's training FLOPs, HF's count (``Fit.floating_point_ops``)
            for a model with ``num_parameters`` or a subclass that overrides it; None: ``flos_per_sample`` x samples.
        flos_params (int | None): the model's ``num_parameters(exclude_embeddings=True)`` taken before sharding.
        publisher (Any): the ``push_to_hub`` publisher of this run, if any.
        neftune_embedding (Any): the embedding NEFTune noises during this run, if any.
        reload_train_loader (Callable[[], Any] | None): builds a new train loader from the run's source (Lightning's
            ``reload_dataloaders_every_n_epochs``).
        reload_eval_loaders (Callable[[], None] | None): builds new ``eval_loaders`` from the run's source (None:
            eval data was given); ``eval_loaded_epoch`` (int) is the epoch they were built at.
        eval_data (Any), data_collator (Any): the eval data and collator given to ``fit`` (HF loader overrides).
        loss_weight (Any): the current micro-batch's share of its accumulation window (HF ``training_step``).
        build_eval_loaders (Callable[[], None] | None), build_plan (Callable[[], Any] | None): set while the
            loaders wait to be asked for where Lightning asks (``LoopPolicy.loaders_after_setup``): the sanity
            check builds ``eval_loaders``, the trainer's ``estimated_stepping_batches`` or the end of the sanity
            check the train loader and the step plan; each builds once.
    """

    stage: str
    model: nn.Module
    module: Any
    state: FitState
    control: FitControl
    wrapped: nn.Module | None = None
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    train_loader: Any = None
    eval_loaders: dict[str | None, Any] = field(default_factory=dict)
    sums: LossSums = field(default_factory=LossSums)
    training_state: TrainingState | None = None
    resume_from: str | None = None
    start_step: int = 0
    flos_per_sample: int = 0
    flos_of: Any = None
    flos_params: int | None = None
    publisher: Any = None
    neftune_embedding: Any = None
    reload_train_loader: Any = None
    reload_eval_loaders: Any = None
    eval_loaded_epoch: int = 0
    eval_data: Any = None
    data_collator: Any = None
    loss_weight: Any = None
    build_eval_loaders: Any = None
    build_plan: Any = None

    @property
    def plan(self) -> RunPlan:
        """The run's plan (step budget, intervals, batch layout; never restored from a checkpoint). It is kept in
        the loop state (``state.plan``), which reads HF ``TrainerState``'s attributes from it; a re-plan assigns
        a new one here."""
        return self.state.plan

    @plan.setter
    def plan(self, value: RunPlan) -> None:
        self.state.plan = value

    @property
    def optimizer(self) -> Any:
        """The first optimizer (HF ``Trainer.optimizer``), None before ``fit`` configured one."""
        return self.optimizers[0] if self.optimizers else None

    @property
    def lr_scheduler(self) -> Any:
        """The first LR scheduler (HF ``Trainer.lr_scheduler``), None without one."""
        return self.schedulers[0].scheduler if self.schedulers else None

    def hf_kwargs(self) -> dict[str, Any]:
        """Keyword arguments HF-style callbacks get with ``on_train_begin`` and the step hooks."""
        return {"model": self.model, "optimizer": self.optimizer, "lr_scheduler": self.lr_scheduler,
                "train_dataloader": self.train_loader}


@dataclass
class _SpawnedResult:
    """What a spawned worker of rank 0 sends back: the stage's output, the trained weights (``fit``), the state,
    ``callback_metrics`` (as Lightning's spawn launcher returns them)."""

    output: Any
    weights: dict[str, Any] | None
    state: dict[str, Any]
    plan: RunPlan
    callback_metrics: dict[str, Any] | None = None


def _check_strategy(fit: Any, model: Any) -> None:
    """:func:`~taskfit.core.quantized.check_quantized_setup` (the strategy part) on the model (or the HF model a
    TaskModule wraps) and the Fit's strategy."""
    if model is None:
        return
    from taskfit.strategies.checkpointing import exportable_model

    check_quantized_setup(exportable_model(model), fit.strategy, training=False)


def _stage_entry(fit: Any, stage: str, model: Any, kwargs: dict[str, Any], caller_pid: int) -> Any:
    return fit._launcher.run_stage(stage, model, kwargs, caller_pid)


class RunLauncher:
    """Launch and run set-up for one ``Fit`` (owned by it): starting a stage on every process, choosing the run's
    model, setting the run up on the strategy and building its loaders. Reads the Fit's configuration (``args``,
    ``strategy``, ``callbacks``, ``model_init``); writes only which run is current (``fit._run``/``_last_fit``) and
    the hook runner.

    Args:
        fit (Fit): the owner; its public overrides (``get_*_dataloader``...) are called through it.

    Attributes:
        depth (int): stage bodies running on this process (0: no call in progress, so ``fit.run`` is None).
    """

    def __init__(self, fit: Any) -> None:
        self.fit = fit
        self.depth = 0

    def launch(self, stage: str, model: Any, kwargs: dict[str, Any]) -> Any:
        """Run ``stage`` on every process through the strategy's one launch path (here, after starting the script's
        worker copies, or inside spawned workers whose rank-0 result comes back: then the trained weights are loaded
        into the caller's model and the loop state into ``fit.state``)."""
        fit = self.fit
        if stage == "fit":  # before any worker starts: a quantized base under a strategy that cannot shard it
            _check_strategy(fit, model if isinstance(model, nn.Module) else getattr(fit, "_given_model", None))
        # a plain function with the Fit among its arguments: spawn launchers pickle the arguments privately per
        # worker (tensors reached through ``fn`` itself would be shared between the workers)
        result = fit.strategy.launch(_stage_entry, fit, stage, model, kwargs, os.getpid())
        if not isinstance(result, _SpawnedResult):
            return result
        fit.callback_metrics.update(result.callback_metrics or {})
        target = model if isinstance(model, nn.Module) else fit.model
        if target is None and fit.model_init is not None:
            target = fit.model_init()
        if target is not None and result.weights is not None:
            target.load_state_dict(result.weights)
        if target is not None:
            module = target if isinstance(target, TaskModule) else ModelTaskModule(target, fit.args.label_names)
            state = fit.state if fit._run is not None else FitState()
            state.load_state_dict(result.state)
            state.plan = result.plan.replace(is_local_process_zero=state.is_local_process_zero,
                                             is_world_process_zero=state.is_world_process_zero)
            fit._run = Run(stage, target, module, state, fit.control)
        return result.output

    def run_stage(self, stage: str, model: Any, kwargs: dict[str, Any], caller_pid: int) -> Any:
        """Body of one stage on this process; the strategy's teardown always follows (``finally``)."""
        fit = self.fit
        body = {"fit": fit._training.fit_stage, "validate": fit._stages.validate_stage,
                "test": fit._stages.test_stage, "predict": fit._stages.predict_stage}[stage]
        self.depth += 1
        try:
            out = body(model, **kwargs)
        except BaseException as exc:
            try:
                fit.strategy.teardown()
            except Exception:  # the run's own error matters more than a failed clean-up
                log.exception("Strategy teardown failed after an error in %s.", stage)
            redact_exception(exc)  # e.g. a storage library's error naming s3://user:password@host/...
            raise
        finally:
            self.depth -= 1
        fit.strategy.teardown()
        if os.getpid() == caller_pid:
            return out
        run = fit._run  # in a spawned worker: send what the caller needs back with the output
        weights = {k: v.detach().cpu() for k, v in run.model.state_dict().items()} if stage == "fit" else None
        metrics = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in fit.callback_metrics.items()}
        return _SpawnedResult(out, weights, run.state.state_dict(), run.plan, metrics)

    def resolve_model(self, model: nn.Module | None, stage: str) -> tuple[nn.Module, TaskModule]:
        """The model and module of a new run: the one given; else for ``fit`` a fresh ``model_init()`` (HF: every
        training without a model starts from new weights); else the last run's model (``model_init()`` when there
        is none).

        Raises:
            ValueError: no model anywhere; for ``fit``, a quantized model without adapters (as HF's Trainer).
            TypeError: a model that is no ``nn.Module``.
        """
        fit = self.fit
        last = fit._run
        if model is None:
            if stage == "fit" and fit.model_init is not None:
                model = fit.model_init()
            elif last is not None:
                model = last.model
            elif getattr(fit, "_given_model", None) is not None:  # HF Trainer(model=...)
                model = fit._given_model
            elif fit.model_init is not None:
                model = fit.model_init()
            else:
                raise ValueError("No model: pass one to fit/validate/test/predict or give Fit(model_init=...).")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a TaskModule or a torch.nn.Module; got {type(model).__name__}.")
        if stage == "fit":  # HF's check: a quantized base trains only with adapters
            check_quantized_training(model)
        if last is not None and model is last.model:
            module = last.module
        else:
            module = model if isinstance(model, TaskModule) else ModelTaskModule(model, fit.args.label_names)
        module._fit = fit
        if last is None or module is not last.module:
            fit._hooks = fit._api.hook_runner(module)
        return model, module

    def setup_run(self, run: Run, max_steps: int | None = None) -> None:
        """Set the run up on the strategy: ``setup`` returns the wrapped module, optimizers and schedulers; then
        gradient checkpointing / ``torch.compile`` once per module."""
        from taskfit.optim.configure import SchedulerConfig

        fit = self.fit
        schedulers = [c.scheduler for c in run.schedulers]
        run.wrapped, run.optimizers, returned = fit.strategy.setup(run.module, run.optimizers, schedulers,
                                                                   max_steps=max_steps)
        if [id(s) for s in returned] != [id(s) for s in schedulers]:  # the backend built its own schedule
            run.schedulers = [SchedulerConfig(s) for s in returned]
        if not getattr(run.module, "_techniques_applied", False):  # once per module (they travel with it)
            from taskfit import efficiency

            efficiency.setup_techniques(fit, run.module)
            run.module._techniques_applied = True

    # ------------------------------------------------------------------------------------------- loaders ---
    def collator(self, data_collator: Callable | None) -> Callable | None:
        """``data_collator``, else the Fit's, else padding with a tokenizer ``processing_class``."""
        fit = self.fit
        collator = data_collator or fit.data_collator
        if collator is None and fit.processing_class is not None and hasattr(fit.processing_class, "pad"):
            from transformers import DataCollatorWithPadding

            collator = DataCollatorWithPadding(fit.processing_class)
        return collator

    def loader(self, data: Any, *, train: bool, collator: Callable | None, what: str, run: Run | None = None) -> Any:
        """This process's loader over ``data`` for ``run`` (default the current one): per-process batch size,
        unused columns of a plain model removed, the strategy's sampler, Lightning's batch limits."""
        fit = self.fit
        run = run or fit._run
        keep = None
        if run is not None and isinstance(run.module, ModelTaskModule) and fit.args.remove_unused_columns:
            names = forward_parameter_names(run.model)
            if names is not None:
                keep = names | set(run.module.label_names) | {"label", "label_ids"}
        a = fit.args
        bs = per_process_batch_size(a, fit.world_size, train)  # split_batches: global size / world
        stage = run.stage if run is not None else "fit"
        overfit = bool(a.overfit_batches) and stage == "fit"

        def prepare(d: Any) -> Any:
            loader = build_dataloader(d, a, train=train and not overfit, batch_size=bs,
                                      collate_fn=self.collator(collator), keep_columns=keep, what=what,
                                      pin_memory_supported=fit.strategy.accelerator.supports_pin_memory())
            if overfit:  # a given DataLoader that shuffles reads in order too (Lightning's warning)
                loader = sequential_loader(loader, "train" if train else "val")
            rule = fit.loop_policy.distributed_sampler
            if rule == "as_given":  # Lightning's use_distributed_sampler=False: every process reads it all
                return loader
            if rule == "lightning" and stage != "predict":  # Lightning's sampler rule
                st = fit.strategy
                loader = shuffled_split_loader(loader, st.data_parallel_size, st.data_parallel_rank, train=train,
                                               overfit=bool(a.overfit_batches))
            return fit.strategy.process_dataloader(loader)

        # several train loaders (a list/dict, Lightning's CombinedLoader): one batch of each per step
        loader = combined_train_loader(data, prepare) if train and is_loader_collection(data) else prepare(data)
        limit = batch_limit(a, stage, train)
        if limit is not None:  # Lightning's fast_dev_run / overfit_batches / limit_*_batches
            loader = limit_batches(loader, limit, "limit_train_batches" if train else f"limit for {what}")
        return loader

    def eval_loader_dict(self, data: Any, collator: Callable | None, run: Run | None = None) -> dict[Any, Any]:
        """The evaluation loaders of ``data``: ``{None: loader}``, ``{name: loader}`` for a dict, ``{i: loader}`` for
        Lightning's list of loaders (keyed by ``dataloader_idx``); ``{}`` for None."""
        if data is None:
            return {}
        if isinstance(data, Mapping):
            return {name: self.loader(d, train=False, collator=collator, what=f"eval dataset {name!r}", run=run)
                    for name, d in data.items()}
        if is_loader_list(data):
            if len(data) == 1:
                data = data[0]
            else:
                return {i: self.loader(d, train=False, collator=collator, what=f"eval dataset {i}", run=run)
                        for i, d in enumerate(data)}
        return {None: self.loader(data, train=False, collator=collator, what="eval dataset", run=run)}
