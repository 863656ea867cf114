"""Turning ``configure_optimizers`` / HF ``optimizers=`` / ``FitArguments`` into an optimizer and a schedule
(F-LOOP-4, F-LOOP-5): the rules Lightning's ``configure_optimizers`` and HF ``Trainer.create_optimizer_and_scheduler``
follow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from taskfit.loops.evaluation_loop import metric_key
from taskfit.optim.optimizers import create_optimizer
from taskfit.optim.schedulers import create_scheduler, is_metric_scheduler

if TYPE_CHECKING:
    from taskfit.fit import Fit
    from taskfit.module import TaskModule


def configure_optimizers(fit: Fit, module: TaskModule, max_steps: int) -> tuple[Any, Any, str, str | None]:
    """Return ``(optimizer, lr_scheduler, interval, monitor)`` for a run of ``max_steps`` optimizer steps.

    Order: a ``configure_optimizers`` result (an optimizer, ``(optimizer, scheduler)``, lists of one each, or
    ``{"optimizer": ..., "lr_scheduler": ...}`` where the scheduler may be ``{"scheduler", "interval",
    "monitor"}``) wins; else HF ``optimizers=(opt, sched)``; else ``optim``/``lr_scheduler_type`` from the
    arguments. ``interval`` is ``"step"``, ``"epoch"``, or ``"eval"`` for metric schedulers
    (``ReduceLROnPlateau``), which then watch ``monitor`` (default ``eval_<metric_for_best_model>`` or ``eval_loss``).

    Raises:
        TypeError: ``configure_optimizers`` returned something else.
        ValueError: an ``interval`` other than ``"step"``/``"epoch"``.
    """
    cfg = module.configure_optimizers()
    opt, sched = fit._optimizers
    interval, monitor = "step", None
    if opt is None and cfg is None:
        opt = create_optimizer(fit.model, fit.args)
        sched = sched or create_scheduler(opt, fit.args, max_steps)
    elif cfg is None and sched is None:  # HF: optimizers=(opt, None) gets the default schedule
        sched = create_scheduler(opt, fit.args, max_steps)
    elif opt is None:
        if isinstance(cfg, torch.optim.Optimizer):
            opt = cfg
        elif isinstance(cfg, Mapping):
            opt, sched = cfg.get("optimizer"), cfg.get("lr_scheduler")
        elif isinstance(cfg, (list, tuple)) and len(cfg) == 2:
            opt, sched = cfg
            opt = opt[0] if isinstance(opt, (list, tuple)) else opt
            sched = (sched[0] if sched else None) if isinstance(sched, (list, tuple)) else sched
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError("configure_optimizers must return an optimizer, (optimizer, scheduler), "
                            f"or {{'optimizer': ..., 'lr_scheduler': ...}}; got {type(cfg).__name__}.")
    check_parameters_in_model(opt, fit.model)
    if isinstance(sched, Mapping):
        interval, monitor = sched.get("interval", "step"), sched.get("monitor")
        sched = sched["scheduler"]
        if interval not in ("step", "epoch"):
            raise ValueError(f"lr_scheduler interval={interval!r} is not valid; choose 'step' or 'epoch'.")
    if sched is not None and is_metric_scheduler(sched):
        interval = "eval"
        monitor = monitor or metric_key(fit.args.metric_for_best_model or "loss", "eval")
    return opt, sched, interval, monitor


def check_parameters_in_model(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """Refuse an optimizer that holds a parameter the model does not have (it would train nothing of the model,
    or another model's weights).

    Raises:
        ValueError: names the parameter group, the index and the shape of the first foreign parameter.
    """
    own = {id(p) for p in model.parameters()}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) not in own:
                raise ValueError(
                    f"The optimizer ({type(optimizer).__name__}) holds a parameter that is not in the model "
                    f"{type(model).__name__}: param_groups[{g}]['params'][{i}] of shape {tuple(p.shape)}. Build the "
                    "optimizer over this model's parameters (model.parameters()).")
