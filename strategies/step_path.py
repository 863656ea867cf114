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

_CPU = torch.device("cpu")


def _inherited(obj: Any, name: str, base: type) -> bool:
    """``obj.<name>`` is ``base.<name>`` itself: neither ``obj``'s class overrides it nor its instance replaces it."""
    return getattr(type(obj), name, None) is getattr(base, name) and name not in getattr(obj, "__dict__", {})


def plain_step_parts(strategy: Any, base: type) -> frozenset[str]:
    """The keys of :data:`PLAIN_STEP_PARTS` that hold for ``strategy``, whose methods are compared with those of
    ``base`` (the base ``Strategy`` class) and whose precision plugin's with :class:`Precision`'s.

    Args:
        strategy (Strategy): a set-up strategy (its ``root_device`` and ``precision`` are final).
        base (type): the class whose step methods are the plain ones (``taskfit.strategies.Strategy``).

    Returns:
        frozenset[str]: a part is named only when every method it involves is the base class's own and the device
        and precision make it a no-op (a CPU device for ``"batch"``, a device other than MPS for ``"forward"``,
        a plugin without an input cast for ``"batch"``); a subclass or an instance that overrides one drops it.
    """
    precision = strategy.precision
    device = strategy.root_device
    cpu = device == _CPU or device.type == "cpu"
    plain = set()
    if (cpu and _inherited(strategy, "batch_to_device", base) and _inherited(precision, "convert_input", Precision)
            and precision.param_dtype is None):
        plain.add("batch")
    if (device.type != "mps" and _inherited(strategy, "forward_context", base)
            and _inherited(precision, "forward_context", Precision)):
        plain.add("forward")
    if _inherited(strategy, "no_backward_sync", base):
        plain.add("sync")
    if _inherited(strategy, "backward", base) and _inherited(precision, "backward", Precision):
        plain.add("backward")
    if (_inherited(strategy, "before_optimizer_step", base) and _inherited(strategy, "unscale_gradients", base)
            and _inherited(precision, "unscale_gradients", Precision)):
        plain.add("unscale")
    if _inherited(strategy, "optimizer_step", base) and _inherited(precision, "optimizer_step", Precision):
        plain.add("optimizer_step")
    return frozenset(plain)
