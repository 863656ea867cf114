"""Stepping the fit loop's learning-rate schedulers (F-LOOP-3): a plain scheduler, or a ``ReduceLROnPlateau`` with
the value it monitors, through the module's ``lr_scheduler_step`` when it overrides it (Lightning)."""

from __future__ import annotations

from typing import Any

from taskfit.core.hooks import overrides
from taskfit.core.hooks import step_scheduler as module_step
from taskfit.errors import configuration_error


def step_scheduler(loop: Any, cfg: Any) -> None:
    """Step one scheduler; a ``ReduceLROnPlateau`` with its monitored value (missing: raise when ``strict``,
    else warn and skip, as Lightning)."""
    module = loop.run.module
    own = overrides(module, "lr_scheduler_step")
    if not cfg.reduce_on_plateau:
        module_step(module, cfg.scheduler, None) if own else cfg.scheduler.step()
        return
    values = monitor_values(loop)
    if cfg.monitor not in values:
        if cfg.strict:
            raise configuration_error(
                f"ReduceLROnPlateau conditioned on metric {cfg.monitor!r}, which is not available. "
                f"Available metrics are: {sorted(values)}. Set it with the 'monitor' key of the "
                "lr_scheduler config.")
        import warnings

        warnings.warn(f"ReduceLROnPlateau conditioned on metric {cfg.monitor!r}, which is not available but "
                      "strict is set to False. Skipping learning rate update.", RuntimeWarning, stacklevel=2)
        return
    value = float(values[cfg.monitor])
    module_step(module, cfg.scheduler, value) if own else cfg.scheduler.step(value)


def monitor_values(loop: Any) -> dict[str, Any]:
    """What a ``ReduceLROnPlateau`` may monitor (Lightning's ``callback_metrics``): logged rows, the latest
    ``self.log`` step values and the running epoch aggregates."""
    out = dict(loop.owner.callback_metrics)
    results = loop.run.module._results
    for e in results.values.values():
        if e.on_step and e.last is not None:
            out[f"{e.name}_step" if e.on_epoch else e.name] = e.last
    epoch = results.epoch_values()
    out.update(epoch)
    for key, value in epoch.items():
        if key.endswith("_epoch"):
            out[key[:-len("_epoch")]] = value
    return out
