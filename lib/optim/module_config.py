"""What a module's ``configure_optimizers`` may return, read by Lightning's rules (``lightning.pytorch.core.optimizer``):
the forms, the scheduler config keys, the warnings and the refusals, with Lightning's messages."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from taskfit.errors import ConfigurationTypeError, configuration_error

_SCHEDULER_KEYS = ("scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau")
_UNKNOWN = ("Unknown configuration for model optimizers. Output from `model.configure_optimizers()` should be one "
            "of:\n * `Optimizer`\n * [`Optimizer`]\n * ([`Optimizer`], [`LRScheduler`])\n"
            ' * {"optimizer": `Optimizer`, (optional) "lr_scheduler": `LRScheduler`}\n')


def _is_optimizer(x: Any) -> bool:
    return isinstance(x, torch.optim.Optimizer)


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _check_optim_dict(d: Mapping) -> None:
    extra = set(d) - {"optimizer", "lr_scheduler", "monitor"}
    if extra:
        warnings.warn(f"Found unsupported keys in the optimizer configuration: {extra}", RuntimeWarning, stacklevel=4)


def split_config(cfg: Any) -> tuple[list[Any], list[Any], list[str | None]]:
    """``configure_optimizers``' result as ``(optimizers, schedulers, monitors)`` (one monitor per scheduler).

    The forms: an optimizer; a list or tuple of optimizers; ``([optimizers], [schedulers])`` (the second may be one
    scheduler); ``(optimizer, scheduler)``; ``{"optimizer", "lr_scheduler", "monitor"}``; a list of such dicts.

    Raises:
        TypeError: any other form (Lightning's "Unknown configuration for model optimizers" message; Lightning
            raises ``MisconfigurationException``).
    """
    if _is_optimizer(cfg):
        return [cfg], [], []
    if isinstance(cfg, Mapping):
        _check_optim_dict(cfg)
        scheds = _as_list(cfg["lr_scheduler"]) if cfg.get("lr_scheduler") is not None else []
        return [cfg.get("optimizer")], scheds, [cfg.get("monitor")] * len(scheds)
    if isinstance(cfg, (list, tuple)) and cfg and all(isinstance(c, Mapping) for c in cfg):
        opts, scheds, monitors = [], [], []
        for c in cfg:
            _check_optim_dict(c)
            opts.append(c.get("optimizer"))
            for s in _as_list(c["lr_scheduler"]) if c.get("lr_scheduler") is not None else []:
                scheds.append(s)
                monitors.append(c.get("monitor"))
        return opts, scheds, monitors
    if isinstance(cfg, (list, tuple)) and len(cfg) == 2 and isinstance(cfg[0], (list, tuple)) and \
            all(_is_optimizer(o) for o in cfg[0]):
        scheds = _as_list(cfg[1])
        return list(cfg[0]), scheds, [None] * len(scheds)
    if isinstance(cfg, (list, tuple)) and len(cfg) == 2 and _is_optimizer(cfg[0]) and not _is_optimizer(cfg[1]) \
            and not (isinstance(cfg[1], Mapping) and "optimizer" in cfg[1]):
        return [cfg[0]], _as_list(cfg[1]), [None]  # (optimizer, scheduler): taskfit also takes this pair
    if isinstance(cfg, (list, tuple)) and cfg and all(_is_optimizer(o) for o in cfg):
        return list(cfg), [], []
    raise configuration_error(_UNKNOWN, ConfigurationTypeError)


def scheduler_fields(sched: Any, monitor: str | None, automatic: bool) -> dict[str, Any]:
    """One scheduler (or scheduler config dict) as the fields of a scheduler config, by Lightning's rules:
    unknown keys warn and are dropped; under manual optimization ``monitor``/``strict``/``reduce_on_plateau``
    warn and are dropped and no monitor is needed.

    Raises:
        ValueError: no ``"scheduler"`` key; an ``interval`` other than ``"step"``/``"epoch"``; a ``frequency``
            below 1; a ``ReduceLROnPlateau`` without a monitor under automatic optimization (Lightning's
            messages; Lightning raises ``MisconfigurationException``).
    """
    from taskfit.optim.schedulers import is_metric_scheduler

    if not isinstance(sched, Mapping):
        plateau = is_metric_scheduler(sched)
        if plateau and automatic and monitor is None:
            raise configuration_error(
                "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is "
                'used. For example: {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": '
                '"metric_to_track"}')
        return {"scheduler": sched, "monitor": monitor if automatic else None, "plateau": plateau and automatic}
    fields = dict(sched)
    if automatic:
        extra = set(fields) - set(_SCHEDULER_KEYS)
        if extra:
            warnings.warn(f"Found unsupported keys in the lr scheduler dict: {extra}. HINT: remove them from the "
                          "output of `configure_optimizers`.", RuntimeWarning, stacklevel=4)
    else:
        ignored = [k for k in fields if k in ("reduce_on_plateau", "monitor", "strict")]
        if ignored:
            warnings.warn(f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You "
                          "need to call `lr_scheduler.step()` manually in manual optimization.", RuntimeWarning,
                          stacklevel=4)
    fields = {k: v for k, v in fields.items() if k in _SCHEDULER_KEYS and (automatic or k not in ignored)}
    if "scheduler" not in fields:
        raise configuration_error(
            'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler')
    if fields.get("interval", "epoch") not in ("step", "epoch"):
        raise configuration_error(f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is '
                                  f'"{fields["interval"]}"')
    frequency = fields.get("frequency", 1)
    if not isinstance(frequency, int) or frequency < 1:
        raise ValueError(f"lr_scheduler frequency={frequency!r} is not valid; it must be an integer >= 1.")
    plateau = fields.pop("reduce_on_plateau", is_metric_scheduler(fields["scheduler"])) and automatic
    fields.setdefault("monitor", monitor if automatic else None)
    if plateau and fields["monitor"] is None:
        raise configuration_error(
            "The lr scheduler dict must include a monitor when a `ReduceLROnPlateau` scheduler is used. "
            'For example: {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": '
            '"your_loss"}}')
    if isinstance(fields["scheduler"], torch.optim.lr_scheduler.OneCycleLR) and \
            fields.get("interval", "epoch") == "epoch":
        warnings.warn("A `OneCycleLR` scheduler is using 'interval': 'epoch'. Are you sure you didn't mean "
                      "'interval': 'step'?", RuntimeWarning, stacklevel=4)
    return {**fields, "plateau": plateau}


def validate(module: Any, optimizers: list[Any], configs: list[Any]) -> None:
    """Lightning's checks of the parsed result.

    Raises:
        RuntimeError: a ``training_step`` with an ``optimizer_idx`` parameter (Lightning 1.x's multi-optimizer
            loop), or several optimizers under automatic optimization.
        ValueError: a scheduler of an optimizer that was not returned; a scheduler that is not a
            ``torch.optim.lr_scheduler`` one without an own ``lr_scheduler_step`` under automatic optimization.
        TypeError: a scheduler without ``state_dict``/``load_state_dict``.
    """
    from taskfit.core.hooks import overrides

    automatic = getattr(module, "automatic_optimization", True)
    step = getattr(module, "training_step", None)
    if step is not None and "optimizer_idx" in inspect.signature(step).parameters:
        raise RuntimeError("Training with multiple optimizers is only supported with manual optimization. Remove the "
                           "`optimizer_idx` argument from `training_step`, set `self.automatic_optimization = False` "
                           "and access your optimizers in `training_step` with `opt1, opt2, ... = self.optimizers()`.")
    if automatic and len(optimizers) > 1:
        raise RuntimeError("Training with multiple optimizers is only supported with manual optimization. Set "
                           "`self.automatic_optimization = False`, then access your optimizers in `training_step` "
                           "with `opt1, opt2, ... = self.optimizers()`.")
    for cfg in configs:
        sched = cfg.scheduler
        if getattr(sched, "optimizer", None) is not None and not any(sched.optimizer is o for o in optimizers):
            raise configuration_error("Some schedulers are attached with an optimizer that wasn't returned from "
                                      "`configure_optimizers`.")
        if not (callable(getattr(sched, "state_dict", None)) and callable(getattr(sched, "load_state_dict", None))):
            raise TypeError(f"The provided lr scheduler `{type(sched).__name__}` is invalid. It should have "
                            "`state_dict` and `load_state_dict` methods defined.")
        torch_kinds = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        if not isinstance(sched, torch_kinds) and automatic and not overrides(module, "lr_scheduler_step"):
            raise configuration_error(
                f"The provided lr scheduler `{type(sched).__name__}` doesn't follow PyTorch's LRScheduler "
                "API. You should override the `LightningModule.lr_scheduler_step` hook with your own "
                "logic if you are using a custom LR scheduler.")
