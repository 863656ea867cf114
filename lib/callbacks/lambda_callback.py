"""``LambdaCallback``: a callback made of functions given by hook name (mirrors
``lightning.pytorch.callbacks.LambdaCallback``)."""

from __future__ import annotations

from typing import Any, Callable

from taskfit.callbacks.base import LIGHTNING_HOOKS, Callback


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, fit: Any, module: Any, *rest: Any) -> Any:  # Lightning-style: (trainer, pl_module, ...)
        return fn(fit, module, *rest)
    return hook


class LambdaCallback(Callback):
    """Each keyword names a Lightning-style hook (``on_train_epoch_end=lambda trainer, pl_module: ...``); the
    function gets the hook's arguments. Only the hooks given are called (a class of its own per instance, so the
    hook runner sees them as overridden).

    Raises:
        TypeError: a keyword that is not a Lightning-style callback hook (names it).
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        hooks = {n: fn for n, fn in hooks.items() if fn is not None}  # None: not given, as Lightning
        unknown = sorted(set(hooks) - set(LIGHTNING_HOOKS))
        if unknown:
            raise TypeError(f"LambdaCallback: unknown hooks {unknown}; valid: {sorted(LIGHTNING_HOOKS)}.")
        self.__class__ = type("LambdaCallback", (LambdaCallback,), {n: _hook(fn) for n, fn in hooks.items()})
