"""``LambdaCallback``: a callback made of functions given by hook name (mirrors
``lightning.pytorch.callbacks.LambdaCallback``)."""

from __future__ import annotations

from typing import Any, Callable

from taskfit.callbacks.base import HF_HOOKS, LIGHTNING_HOOKS, Callback


def _hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, fit: Any, module: Any, *rest: Any, **kwargs: Any) -> Any:  # Lightning-style: (trainer, pl_module, ...)
        return fn(fit, module, *rest, **kwargs)
    return hook


def _hf_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:  # HF-style: (args, state, control)
        return fn(args, state, control, **kwargs)
    return hook


class LambdaCallback(Callback):
    """Each keyword names a callback hook (``on_train_epoch_end=lambda trainer, pl_module: ...``); the function gets
    the hook's arguments: ``(trainer, pl_module, ...)`` for a Lightning-style hook, ``(args, state, control,
    **kwargs)`` for one of the Hugging Face hooks :class:`Callback` also has (``on_log``, ``on_evaluate``, ...).
    Only the hooks given are called (a class of its own per instance, so the hook runner sees them as overridden).

    Raises:
        TypeError: a keyword that is not a hook of :class:`Callback` (names it and lists the valid ones).
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        hooks = {n: fn for n, fn in hooks.items() if fn is not None}  # None: not given, as Lightning
        unknown = sorted(set(hooks) - set(LIGHTNING_HOOKS) - set(HF_HOOKS))
        if unknown:
            raise TypeError(f"LambdaCallback: unknown hooks {unknown}; valid: {sorted(LIGHTNING_HOOKS + HF_HOOKS)}.")
        self.__class__ = type("LambdaCallback", (LambdaCallback,),
                              {n: (_hf_hook if n in HF_HOOKS else _hook)(fn) for n, fn in hooks.items()})
