"""Which step-path operations of a strategy do nothing beyond the plain PyTorch call, decided once per run.

The fit loop calls the strategy for every micro-batch: move the batch, enter the forward context and the
gradient-sync context, backward, unscale before the optimizer step, the optimizer step. On one CPU process in
fp32 each of these is a layer of calls that ends in a no-op (``contextlib.nullcontext()``, a batch returned as
is) or in the plain call (``loss.backward()``, ``optimizer.step()``). :func:`plain_step_parts` names the parts
for which that holds, so the loop resolves them once and skips the layer per step (the same idea as the
callback hooks resolved once: what overrides nothing costs nothing per step; Lightning Fabric likewise keeps
``_BackwardSyncControl`` only on strategies that have one).
"""

from __future__ import annotations

from typing import Any

import torch

from taskfit.precision.precision import Precision

#: the parts :func:`plain_step_parts` may name, with what the loop does instead of calling the strategy
PLAIN_STEP_PARTS = {
    "batch": "batch_to_device(batch) is the batch itself: nothing to move or cast",
    "forward": "forward_context() is a no-op context: the forward runs without one",
    "sync": "no_backward_sync(enabled) is a no-op context: backward runs without one",
    "backward": "backward(loss) is loss.backward()",
    "unscale": "before_optimizer_step(opt, hook) is hook(opt): nothing to unscale",
    "optimizer_step": "optimizer_step(opt) is opt.step() and returns True",
}

#: the methods of the base ``Strategy`` / of :class:`Precision` each part involves
STRATEGY_METHODS = {"batch": ("batch_to_device",), "forward": ("forward_context",), "sync": ("no_backward_sync",),
                    "backward": ("backward",), "unscale": ("before_optimizer_step", "unscale_gradients"),
                    "optimizer_step": ("optimizer_step",)}
PRECISION_METHODS = {"batch": ("convert_input",), "forward": ("forward_context",), "sync": (),
                     "backward": ("backward",), "unscale": ("unscale_gradients",), "optimizer_step": ("optimizer_step",)}

_CPU = torch.device("cpu")


def step_originals(cls: type) -> dict[str, Any]:
    """The functions ``cls`` defines for the methods of :data:`STRATEGY_METHODS` (or :data:`PRECISION_METHODS` for
    :class:`Precision`), taken once when the class is defined: a wrapper set on the class later (a profiler, a test
    that records calls) is then not plain, and is called."""
    names = STRATEGY_METHODS if cls is not Precision else PRECISION_METHODS
    return {n: vars(cls)[n] for methods in names.values() for n in methods}


_PRECISION_ORIGINALS = step_originals(Precision)


def _original(obj: Any, name: str, originals: dict[str, Any]) -> bool:
    """``obj.<name>`` is the original function: neither ``obj``'s class overrides or wraps it nor its instance
    replaces it."""
    return getattr(type(obj), name, None) is originals[name] and name not in getattr(obj, "__dict__", {})


def plain_step_parts(strategy: Any, originals: dict[str, Any]) -> frozenset[str]:
    """The keys of :data:`PLAIN_STEP_PARTS` that hold for ``strategy``.

    Args:
        strategy (Strategy): a set-up strategy (its ``root_device`` and ``precision`` are final).
        originals (dict[str, Callable]): the base ``Strategy``'s own step functions (:func:`step_originals`).

    Returns:
        frozenset[str]: a part is named only when every method it involves, on the strategy and on its precision
        plugin, is the base class's original function, and the device and precision make it a no-op: a CPU device
        and a plugin without an input cast for ``"batch"``, a device other than MPS for ``"forward"`` (its missing
        operator hint). A subclass or an instance that overrides or wraps one of the methods drops the part.
    """
    precision, device = strategy.precision, strategy.root_device
    plain = {part for part in PLAIN_STEP_PARTS
             if all(_original(strategy, n, originals) for n in STRATEGY_METHODS[part])
             and all(_original(precision, n, _PRECISION_ORIGINALS) for n in PRECISION_METHODS[part])}
    if not (device == _CPU or device.type == "cpu") or precision.param_dtype is not None:
        plain.discard("batch")
    if device.type == "mps":
        plain.discard("forward")
    return frozenset(plain)
