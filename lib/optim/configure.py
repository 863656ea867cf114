"""Turning ``configure_optimizers`` / HF ``optimizers=`` / ``FitArguments`` into an optimizer and a schedule
(F-LOOP-4, F-LOOP-5): the rules Lightning's ``configure_optimizers`` and HF ``Trainer.create_optimizer_and_scheduler``
follow."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from taskfit.core.hook_logging import running
from taskfit.errors import ConfigurationTypeError, configuration_error
from taskfit.metrics import metric_key
from taskfit.optim.layerwise import LayerWiseOptimizer
from taskfit.optim.module_config import _SCHEDULER_KEYS
from taskfit.optim.optimizers import create_optimizer
from taskfit.optim.schedulers import create_scheduler, is_metric_scheduler

if TYPE_CHECKING:
    from taskfit.core.module import TaskModule


@dataclass(eq=False)
class SchedulerConfig:
    """An LR scheduler with when it steps (Lightning's ``lr_scheduler`` config, ``LRSchedulerConfig``).

    Attributes:
        scheduler (LRScheduler | ReduceLROnPlateau): the schedule.
        interval (str): ``"step"`` (after optimizer steps), ``"epoch"`` (at the end of training epochs), or
            ``"eval"`` (metric schedulers built from ``FitArguments``/HF ``optimizers=``, after every evaluation).
        monitor (str | None): the metric a ``ReduceLROnPlateau`` watches.
        frequency (int): step every ``frequency`` batches (``"step"``) or epochs (``"epoch"``), as Lightning.
        strict (bool): a monitored metric that is missing raises (True) or warns and skips the step (False).
        name (str | None): a name for LR monitors.
        plateau (bool | None): steps with the monitored value (Lightning's ``reduce_on_plateau``); None: whether
            the scheduler is a ``ReduceLROnPlateau``.

    A config equals another object with the same fields (Lightning's ``LRSchedulerConfig`` too).
    """

    scheduler: Any
    interval: str = "step"
    monitor: str | None = None
    frequency: int = 1
    strict: bool = True
    name: str | None = None
    plateau: bool | None = None

    @property
    def reduce_on_plateau(self) -> bool:
        """True for metric schedulers (``ReduceLROnPlateau``), which step with a monitored value."""
        return is_metric_scheduler(self.scheduler) if self.plateau is None else self.plateau

    def __eq__(self, other: object) -> bool:
        names = ("scheduler", "interval", "monitor", "frequency", "strict", "name", "reduce_on_plateau")
        if not all(hasattr(other, n) for n in names):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in names)

    __hash__ = object.__hash__


class NoOptimizer(torch.optim.Optimizer):
    """An optimizer over one placeholder tensor whose ``step`` changes nothing (Lightning's ``_MockOptimizer``, used
    when ``configure_optimizers`` returns None under the Lightning door): the loop runs, the weights stay."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {"lr": 0.0})

    def step(self, closure: Any = None) -> Any:
        """Run ``closure`` (if any) and return its result; no parameter changes."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to zero (the module's gradients are left to the next backward)."""


def _one_scheduler(sched: Any, args: Any, from_module: bool = False, monitor: str | None = None) -> SchedulerConfig:
    """A scheduler config. A module's scheduler without a config steps every epoch (Lightning's default), one
    from ``FitArguments`` or HF ``optimizers=`` every optimizer step (HF's)."""
    interval = "epoch" if from_module else "step"
    frequency, strict, name = 1, True, None
    if isinstance(sched, Mapping):
        unknown = sorted(set(sched) - set(_SCHEDULER_KEYS))
        if unknown:
            raise ValueError(f"lr_scheduler config has unknown keys {unknown}; valid keys: {list(_SCHEDULER_KEYS)}.")
        if "scheduler" not in sched:
            raise ValueError("an lr_scheduler config dict needs the key 'scheduler'.")
        interval = sched.get("interval", interval)
        monitor = sched.get("monitor", monitor)
        frequency, strict, name = sched.get("frequency", 1), sched.get("strict", True), sched.get("name")
        sched = sched["scheduler"]
        if interval not in ("step", "epoch"):
            raise ValueError(f"lr_scheduler interval={interval!r} is not valid; choose 'step' or 'epoch'.")
        if not isinstance(frequency, int) or frequency < 1:
            raise ValueError(f"lr_scheduler frequency={frequency!r} is not valid; it must be an integer >= 1.")
    if is_metric_scheduler(sched):
        if from_module:
            if monitor is None:
                raise ValueError("configure_optimizers must include a monitor when a ReduceLROnPlateau scheduler "
                                 "is used, e.g. {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, "
                                 "'monitor': 'val_loss'}}.")
        else:
            interval = "eval"
            monitor = monitor or metric_key(args.metric_for_best_model or "loss", "eval")
    return SchedulerConfig(sched, interval, monitor, frequency, strict, name)


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _user_defined(obj: Any, name: str) -> bool:
    """Whether the class that defines ``obj.<name>`` is the user's (not one of taskfit's own classes)."""
    owner = next((c for c in type(obj).__mro__ if name in vars(c)), None)
    return owner is not None and not owner.__module__.startswith("taskfit.")


def configure_optimizers(module: TaskModule, model: torch.nn.Module, args: Any, max_steps: int,
                         hf_optimizers: tuple[Any, Any] = (None, None), *,
                         strategy_builds_optimizer: bool = False,
                         none_trains_nothing: bool = False) -> tuple[list[Any], list[SchedulerConfig]]:
    """Return ``(optimizers, schedulers)`` for a run of ``max_steps`` optimizer steps.

    Order: a ``configure_optimizers`` result (an optimizer; ``(optimizer, scheduler)``; ``([optimizers],
    [schedulers])``; ``{"optimizer": ..., "lr_scheduler": ...}``; or a list of such dicts, Lightning's forms; a
    scheduler may be ``{"scheduler", "interval", "monitor"}``) wins; else HF ``optimizers=(opt, sched)``; else
    ``optim``/``lr_scheduler_type`` from ``args`` (over ``model``'s parameters). Several optimizers need manual
    optimization (``automatic_optimization = False``), as in Lightning 2.x, and are then stepped by the module.
    ``interval`` is ``"step"``, ``"epoch"``, or ``"eval"`` for metric schedulers
    (``ReduceLROnPlateau``), which then watch ``monitor`` (default ``eval_<metric_for_best_model>`` or
    ``eval_loss``). With ``strategy_builds_optimizer`` (a DeepSpeed config with an ``optimizer`` section) no
    optimizer is built here: the strategy's ``setup`` returns its own. With ``none_trains_nothing`` (the Lightning
    door) a module's ``configure_optimizers`` returning None gives Lightning's warning and an optimizer whose step
    changes nothing (Lightning's ``_MockOptimizer``) instead of the default optimizer.

    Raises:
        TypeError: ``configure_optimizers`` returned something else, or a scheduler without ``state_dict``.
        ValueError: an ``interval`` other than ``"step"``/``"epoch"``, a ``ReduceLROnPlateau`` without a monitor,
            a scheduler of an optimizer not returned (Lightning's messages, :mod:`taskfit.optim.module_config`); an
            optimizer defined both by the module or ``optimizers=`` and by the strategy's backend config.
        RuntimeError: several optimizers under automatic optimization (Lightning's refusal).
    """
    with running(module, "configure_optimizers"):
        cfg = module.configure_optimizers()
    if cfg is None and none_trains_nothing and hf_optimizers[0] is None and not strategy_builds_optimizer and \
            _user_defined(module, "configure_optimizers"):
        warnings.warn("`LightningModule.configure_optimizers` returned `None`, this fit will run with no optimizer",
                      UserWarning, stacklevel=2)  # Lightning's warning
        return [NoOptimizer()], []
    if cfg is None and hf_optimizers[0] is None and not strategy_builds_optimizer and _user_defined(
            module, "configure_optimizers"):
        warnings.warn(f"{type(module).__name__}.configure_optimizers returned None, so this run trains with the "
                      f"default optimizer built from the arguments (optim={args.optim!r}, learning_rate="
                      f"{args.learning_rate}). Return the optimizer (or {{'optimizer': ..., 'lr_scheduler': ...}}) "
                      "to use your own; delete the method to keep the default without this warning.",
                      UserWarning, stacklevel=2)
    opt, sched = hf_optimizers
    if strategy_builds_optimizer:
        if opt is not None or cfg is not None:
            raise ValueError("The DeepSpeed config has an 'optimizer' section, but the module's configure_optimizers "
                             "or Fit(optimizers=...) define an optimizer too; drop one of them.")
        return [], []
    if opt is None and cfg is None:
        opt = create_optimizer(model, args)
        opts, scheds = [opt], _as_list(sched or create_scheduler(opt, args, max_steps))
    elif cfg is None:
        opts = [opt]
        scheds = _as_list(sched if sched is not None else create_scheduler(opt, args, max_steps))  # HF default
    else:
        return _from_module(module, cfg)
    for o in opts:
        check_parameters_in_model(o, module)
    return opts, [_one_scheduler(s, args) for s in scheds]


def _from_module(module: TaskModule, cfg: Any) -> tuple[list[Any], list[SchedulerConfig]]:
    """A ``configure_optimizers`` result, read and checked by Lightning's rules (:mod:`taskfit.optim.module_config`);
    a module's scheduler without a config steps every epoch."""
    from taskfit.optim.module_config import scheduler_fields, split_config, validate

    opts, scheds, monitors = split_config(cfg)
    if not opts or not all(isinstance(o, torch.optim.Optimizer) for o in opts):
        raise configuration_error("Unknown configuration for model optimizers: configure_optimizers returned "
                                  f"{type(cfg).__name__} without an optimizer.", ConfigurationTypeError)
    automatic = getattr(module, "automatic_optimization", True)
    configs = []
    for s, m in zip(scheds, monitors):
        f = scheduler_fields(s, m, automatic)
        configs.append(SchedulerConfig(f["scheduler"], f.get("interval", "epoch"), f.get("monitor"),
                                       f.get("frequency", 1), f.get("strict", True), f.get("name"), f["plateau"]))
    validate(module, opts, configs)
    for o in opts:
        check_parameters_in_model(o, module)
    return opts, configs


def check_parameters_in_model(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """Refuse an optimizer that holds a parameter the model does not have (it would train nothing of the model,
    or another model's weights).

    Raises:
        ValueError: names the parameter group, the index and the shape of the first foreign parameter.
    """
    if isinstance(optimizer, LayerWiseOptimizer):  # its own group holds only a placeholder (HF's dummy)
        for inner in optimizer.optimizer_dict.values():
            check_parameters_in_model(inner, model)
        return
    own = {id(p) for p in model.parameters()}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) not in own:
                raise ValueError(
                    f"The optimizer ({type(optimizer).__name__}) holds a parameter that is not in the model "
                    f"{type(model).__name__}: param_groups[{g}]['params'][{i}] of shape {tuple(p.shape)}. Build the "
                    "optimizer over this model's parameters (model.parameters()).")
