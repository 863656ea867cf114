"""Which hook is running (the module's ``_current_fx_name``, set by whoever calls a hook) and, where a door gives a
table of the hooks that may log, the check ``self.log`` makes against it (Lightning's ``_FxValidator``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from taskfit.errors import configuration_error

__all__ = ["FX", "call_named", "call_plain", "check_hook_log", "check_metric_attribute", "named", "named_step",
           "running"]

#: the module ``__dict__`` key naming the hook being run (Lightning's ``LightningModule._current_fx_name``)
FX = "_current_fx_name"

_NO_RESULTS = ("You are trying to `self.log()` but the loop's result collection is not registered yet. This is most "
               "likely because you are trying to log in a `predict` hook, but it doesn't support logging")
_NOT_MANAGED = "You are trying to `self.log()` but it is not managed by the `Trainer` control flow"


@contextlib.contextmanager
def running(module: Any, name: str) -> Iterator[None]:
    """``name`` is the running hook of ``module`` inside the block (the previous one after), as Lightning's
    ``_call_lightning_module_hook``/``_call_callback_hooks`` set ``_current_fx_name``; for the hooks called once
    per stage (the per-step ones are named by :class:`taskfit.callbacks.base.HookRunner`). ``module`` None: no-op.
    """
    state = getattr(module, "__dict__", {})
    prev, state[FX] = state.get(FX), name
    try:
        yield
    finally:
        state[FX] = prev


def named(module: Any, name: str, hook: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """``hook`` (``module``'s hook ``name``, or None) made to run with ``name`` as the running hook (:func:`running`);
    None stays None."""
    if hook is None:
        return None

    def call(*args: Any, **kwargs: Any) -> Any:
        with running(module, name):
            return hook(*args, **kwargs)
    return call


def named_step(module: Any, name: str, step_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``step_fn`` (the route to ``module``'s step method ``name``) made to run with ``name`` as the running hook,
    as Lightning's ``_call_strategy_hook`` names ``training_step``/``validation_step``/``test_step``; plain stores
    (no context manager), as it runs once per batch. Only where a door checks ``self.log`` against its hooks."""
    state = module.__dict__

    def call(*args: Any, **kwargs: Any) -> Any:
        prev, state[FX] = state.get(FX), name
        try:
            return step_fn(*args, **kwargs)
        finally:
            state[FX] = prev
    return call


def call_named(module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``module.<name>(*args, **kwargs)`` run as the running hook ``name`` (a module's own ``backward``,
    ``optimizer_step``, ``optimizer_zero_grad``, ``configure_gradient_clipping`` under a door that checks
    ``self.log``: Lightning's ``_call_lightning_module_hook``)."""
    state = module.__dict__
    prev, state[FX] = state.get(FX), name
    try:
        return getattr(module, name)(*args, **kwargs)
    finally:
        state[FX] = prev


def call_plain(module: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``module.<name>(*args, **kwargs)``, the running hook left as it is (``Fit``: ``self.log`` reads none)."""
    return getattr(module, name)(*args, **kwargs)


def check_hook_log(rules: Mapping[str, Any], fx: str | None, on_step: bool | None, on_epoch: bool | None,
                   collecting: bool) -> None:
    """Lightning's checks of a ``self.log`` call made inside hook ``fx``.

    Args:
        rules (Mapping): hook name -> None (the hook cannot log) or ``(allowed on_step values, allowed on_epoch
            values, default on_step, default on_epoch)``; hooks missing from it are not checked.
        fx (str | None): the running hook (None: no hook the trainer runs, e.g. a user's call after ``fit``
            returned or from a data set's ``__getitem__``).
        on_step (bool | None), on_epoch (bool | None): as given to ``self.log`` (None: the hook's default).
        collecting (bool): whether a running stage keeps logged values (False during ``predict`` and when no
            trainer method runs: Lightning's ``trainer._results`` is None then).

    Raises:
        ConfigurationError: Lightning's ``MisconfigurationException`` messages: no result collection (``predict``,
            no trainer method running), "not managed by the `Trainer` control flow" (``fx`` None), "You can't
            `self.log()` inside `<fx>`", or an ``on_step``/``on_epoch`` value the hook does not allow ("must be
            one of").
    """
    if not collecting:
        raise configuration_error(_NO_RESULTS)
    if fx is None:
        raise configuration_error(_NOT_MANAGED)
    if fx not in rules:
        return
    rule = rules[fx]
    if rule is None:
        raise configuration_error(f"You can't `self.log()` inside `{fx}`. HINT: You can still log directly to the "
                                  "logger by using `self.logger.experiment`.")
    steps, epochs, d_step, d_epoch = rule
    for key, value, allowed in (("on_step", d_step if on_step is None else on_step, steps),
                                ("on_epoch", d_epoch if on_epoch is None else on_epoch, epochs)):
        if value not in allowed:
            raise configuration_error(f"You can't `self.log({key}={value})` inside `{fx}`, must be one of {allowed}.")


def check_metric_attribute(module: Any, name: str, value: Any, metric_attribute: str | None) -> None:
    """Lightning's refusal of a ``torchmetrics.Metric`` logged as ``name`` that ``module`` does not hold among its
    submodules (``LightningModule.log``: it restores the metric's state through that attribute). The holders are
    found once per module (``_metric_attributes``, Lightning's cache); a given ``metric_attribute`` is not checked.

    Raises:
        ConfigurationError: Lightning's "Could not find the `LightningModule` attribute for the
            `torchmetrics.Metric` logged" (naming the Metric attributes the module has, if any).
    """
    tm = sys.modules.get("torchmetrics")  # a Metric exists only once torchmetrics is imported
    if metric_attribute is not None or tm is None or not isinstance(value, tm.Metric):
        return
    found = module.__dict__.get("_metric_attributes")
    if found is None:
        found = module.__dict__["_metric_attributes"] = {
            id(m): n for n, m in module.named_modules() if isinstance(m, tm.Metric)}
    if not found:
        raise configuration_error("Could not find the `LightningModule` attribute for the `torchmetrics.Metric` "
                                  "logged. You can fix this by setting an attribute for the metric in your "
                                  "`LightningModule`.")
    if id(value) not in found:
        raise configuration_error("Could not find the `LightningModule` attribute for the `torchmetrics.Metric` "
                                  f"logged. You can fix this by calling `self.log({name}, ..., metric_attribute=name)` "
                                  f"where `name` is one of {list(found.values())}")
