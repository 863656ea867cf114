"""Which hook is running (the module's ``_current_fx_name``, set by whoever calls a hook) and, where a door gives a
table of the hooks that may log, the check ``self.log`` makes against it (Lightning's ``_FxValidator``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from taskfit.errors import configuration_error

__all__ = ["FX", "check_hook_log", "named", "running"]

#: the module ``__dict__`` key naming the hook being run (Lightning's ``LightningModule._current_fx_name``)
FX = "_current_fx_name"

_NO_RESULTS = ("You are trying to `self.log()` but the loop's result collection is not registered yet. This is most "
               "likely because you are trying to log in a `predict` hook, but it doesn't support logging")


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


def check_hook_log(rules: Mapping[str, Any], fx: str | None, on_step: bool | None, on_epoch: bool | None,
                   collecting: bool) -> None:
    """Lightning's checks of a ``self.log`` call made inside hook ``fx``.

    Args:
        rules (Mapping): hook name -> None (the hook cannot log) or ``(allowed on_step values, allowed on_epoch
            values, default on_step, default on_epoch)``; hooks missing from it are not checked.
        fx (str | None): the running hook (None: not known, not checked).
        on_step (bool | None), on_epoch (bool | None): as given to ``self.log`` (None: the hook's default).
        collecting (bool): whether the running stage keeps logged values (False during ``predict``).

    Raises:
        ConfigurationError: Lightning's ``MisconfigurationException`` messages: no result collection (``predict``),
            "You can't `self.log()` inside `<fx>`", or an ``on_step``/``on_epoch`` value the hook does not allow
            ("must be one of").
    """
    if not collecting:
        raise configuration_error(_NO_RESULTS)
    if fx is None or fx not in rules:
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
