"""Calling a step method with the arguments its signature accepts: Lightning allows ``training_step(self,
batch)`` without ``batch_idx`` and evaluation steps without ``dataloader_idx`` (mirrors Lightning's
``is_param_in_hook_signature`` check). Decided once per run, so the hot path pays one slice per call at most."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def positional_capacity(method: Callable[..., Any]) -> int | None:
    """How many positional arguments ``method`` (bound) takes; None when it takes any number (``*args``) or its
    signature cannot be read."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def by_signature(step_fn: Callable[..., Any], method: Callable[..., Any]) -> Callable[..., Any]:
    """``step_fn`` (the strategy's route to ``method``, e.g. through the DDP wrapper) called with only as many
    positional arguments as ``method`` accepts; ``step_fn`` itself when it accepts them all."""
    n = positional_capacity(method)
    if n is None or n >= 3:
        return step_fn
    return lambda *args: step_fn(*args[:n])


def step_disabled(module: Any, name: str) -> bool:
    """True when ``module.<name>`` was set to None on the instance (``model.validation_step = None``): Lightning
    then runs no such loop (its ``is_overridden`` reads the instance attribute)."""
    return name in getattr(module, "__dict__", {}) and module.__dict__[name] is None
