"""The run object: what one ``Fit.fit``/``validate``/``test``/``predict`` call works on.

``Fit`` holds configuration (arguments, callbacks, loggers, the resolved strategy); every call builds a
:class:`Run` that owns the model, the module, the optimizers and schedulers the strategy returned from
``setup``, the loaders, the loop state and the resume point. Nothing of one run leaks into the next, so calling
``fit`` twice, ``auto_find_batch_size`` retries and hyperparameter-search trials start clean by construction.
``Fit``'s HF-style attributes (``fit.model``, ``fit.optimizer``, ``fit.state``...) read the current (or last) run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from taskfit.callbacks.base import HookRunner
from taskfit.loops.state import FitControl, FitState, LossSums, TrainingState
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
        wrapped (nn.Module | None): what ``Strategy.setup`` returned for ``module`` (DDP/FSDP wrapper, engine).
        optimizers (list[Optimizer]): as returned by ``Strategy.setup`` (several step together each window).
        schedulers (list[SchedulerConfig]): their schedules with step interval and monitored metric.
        train_loader (Any), eval_loaders (dict[str | None, Any]): the run's loaders.
        sums (LossSums): the fit loop's running loss sums.
        training_state (TrainingState | None): the state saved and restored whole (``fit`` only).
        resume_from (str | None): the checkpoint this run continues (restored before the loop starts).
        start_step (int): ``global_step`` at the start (after a restore).
        flos_per_sample (int): training FLOPs per sample (6 x parameters).
        publisher (Any): the ``push_to_hub`` publisher of this run, if any.
        neftune_embedding (Any): the embedding NEFTune noises during this run, if any.
        eval_data (Any), data_collator (Any): the eval data and collator given to ``fit`` (HF loader overrides).
        loss_weight (Any): the current micro-batch's share of its accumulation window (HF ``training_step``).
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
    publisher: Any = None
    neftune_embedding: Any = None
    eval_data: Any = None
    data_collator: Any = None
    loss_weight: Any = None

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
    """What a spawned worker of rank 0 sends back: the stage's output, the trained weights (``fit``), the state."""

    output: Any
    weights: dict[str, Any] | None
    state: dict[str, Any]


def _stage_entry(fit: Any, stage: str, model: Any, kwargs: dict[str, Any], caller_pid: int) -> Any:
    return fit._run_stage(stage, model, kwargs, caller_pid)


class RunLifecycle:
    """The part of ``Fit`` that starts runs: launching a stage on every process, choosing the run's model and
    setting the run up on the strategy. Reads ``Fit``'s configuration (``args``, ``strategy``, ``callbacks``,
    ``model_init``); writes only ``_run``/``_last_fit`` (which run is current) and the hook runner."""

    args: Any
    strategy: Any
    callbacks: list[Any]
    model_init: Any
    _run: Run | None
    _hooks: Any

    def _launch(self, stage: str, model: Any, kwargs: dict[str, Any]) -> Any:
        """Run ``stage`` on every process through the strategy's one launch path (here, after starting the script's
        worker copies, or inside spawned workers whose rank-0 result comes back: then the trained weights are loaded
        into the caller's model and the loop state into ``fit.state``)."""
        # a plain function with the Fit among its arguments: spawn launchers pickle the arguments privately per
        # worker (tensors reached through ``fn`` itself would be shared between the workers)
        result = self.strategy.launch(_stage_entry, self, stage, model, kwargs, os.getpid())
        if not isinstance(result, _SpawnedResult):
            return result
        target = model if isinstance(model, nn.Module) else self.model
        if target is None and self.model_init is not None:
            target = self.model_init()
        if target is not None and result.weights is not None:
            target.load_state_dict(result.weights)
        if target is not None:
            module = target if isinstance(target, TaskModule) else ModelTaskModule(target, self.args.label_names)
            state = self.state if self._run is not None else FitState()
            state.load_state_dict({k: v for k, v in result.state.items()
                                   if k not in ("is_local_process_zero", "is_world_process_zero")})
            self._run = Run(stage, target, module, state, self.control)
        return result.output

    def _run_stage(self, stage: str, model: Any, kwargs: dict[str, Any], caller_pid: int) -> Any:
        """Body of one stage on this process; the strategy's teardown always follows (``finally``)."""
        body = {"fit": self._fit_stage, "validate": self._validate_stage, "test": self._test_stage,
                "predict": self._predict_stage}[stage]
        try:
            out = body(model, **kwargs)
        except BaseException:
            try:
                self.strategy.teardown()
            except Exception:  # the run's own error matters more than a failed clean-up
                log.exception("Strategy teardown failed after an error in %s.", stage)
            raise
        self.strategy.teardown()
        if os.getpid() == caller_pid:
            return out
        run = self._run  # in a spawned worker: send what the caller needs back with the output
        weights = {k: v.detach().cpu() for k, v in run.model.state_dict().items()} if stage == "fit" else None
        return _SpawnedResult(out, weights, run.state.state_dict())

    def _resolve_model(self, model: nn.Module | None, stage: str) -> tuple[nn.Module, TaskModule]:
        """The model and module of a new run: the one given; else for ``fit`` a fresh ``model_init()`` (HF: every
        training without a model starts from new weights); else the last run's model (``model_init()`` when there
        is none)."""
        last = self._run
        if model is None:
            if stage == "fit" and self.model_init is not None:
                model = self.model_init()
            elif last is not None:
                model = last.model
            elif getattr(self, "_given_model", None) is not None:  # HF Trainer(model=...)
                model = self._given_model
            elif self.model_init is not None:
                model = self.model_init()
            else:
                raise ValueError("No model: pass one to fit/validate/test/predict or give Fit(model_init=...).")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a TaskModule or a torch.nn.Module; got {type(model).__name__}.")
        if last is not None and model is last.model:
            module = last.module
        else:
            module = model if isinstance(model, TaskModule) else ModelTaskModule(model, self.args.label_names)
        module._fit = self
        if last is None or module is not last.module:
            self._hooks = HookRunner(self.callbacks, module)
        return model, module

    def _setup_run(self, run: Run, max_steps: int | None = None) -> None:
        """Set the run up on the strategy: ``setup`` returns the wrapped module, optimizers and schedulers; then
        gradient checkpointing / ``torch.compile`` once per module."""
        from taskfit.optim.configure import SchedulerConfig

        schedulers = [c.scheduler for c in run.schedulers]
        run.wrapped, run.optimizers, returned = self.strategy.setup(run.module, run.optimizers, schedulers,
                                                                    max_steps=max_steps)
        if [id(s) for s in returned] != [id(s) for s in schedulers]:  # the backend built its own schedule
            run.schedulers = [SchedulerConfig(s) for s in returned]
        if not getattr(run.module, "_techniques_applied", False):  # once per module (they travel with it)
            from taskfit import efficiency

            efficiency.setup_techniques(self, run.module)
            run.module._techniques_applied = True

