"""The optimizer handle ``TaskModule.optimizers()`` returns (mirrors Lightning's ``LightningOptimizer``): ``step``
goes through the strategy (precision plugin: loss-scaler step and skipped steps) and calls the
``on_before_optimizer_step`` hooks; everything else reads the wrapped optimizer."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


class LightningOptimizer:
    """A thin handle on ``optimizer`` for manual optimization.

    Args:
        optimizer (torch.optim.Optimizer): the run's optimizer (as the strategy returned it).
        module (TaskModule): the module whose run steps it.
        after_closure (Callable[[Optimizer], None] | None): what runs between the closure and the step (the
            fit loop's ``on_before_optimizer_step`` hooks and clipping); default: the module's hooks only.
    """

    def __init__(self, optimizer: Any, module: Any, after_closure: Callable[[Any], None] | None = None) -> None:
        self.__dict__["_optimizer"] = optimizer
        self.__dict__["_module"] = module
        self.__dict__["_after_closure"] = after_closure
        self.__dict__["stepped"] = False

    @property
    def optimizer(self) -> Any:
        """The wrapped ``torch.optim.Optimizer``."""
        return self._optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._optimizer, name, value)

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Run ``closure`` (if any: it computes the loss and calls ``manual_backward``), unscale the gradients
        (``"16-mixed"``), the ``on_before_optimizer_step`` hooks, then the optimizer step through the precision
        plugin. Mirrors Lightning's ``LightningOptimizer.step`` (its precision plugin unscales before the hook in
        manual optimization too).

        Returns:
            the closure's result (None without one).
        """
        result = closure() if closure is not None else None
        module = self._module
        if self._after_closure is not None:  # automatic optimization: the hook and clipping, as the loop does
            self._after_closure(self._optimizer)
        else:  # manual: the strategy unscales first (the one place that does), so the hooks see true gradients
            module._fit.strategy.before_optimizer_step(self._optimizer, self._before_step_hooks)
        self.__dict__["stepped"] = module._fit.strategy.optimizer_step(self._optimizer)
        module.__dict__["_manual_steps"] = module.__dict__.get("_manual_steps", 0) + 1
        return result

    def _before_step_hooks(self, optimizer: Any) -> None:
        self._module._call_hook("on_before_optimizer_step", optimizer)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Inside, only this optimizer's parameters require grad (``toggle_optimizer``) and, with
        ``sync_grad=False``, ``manual_backward`` accumulates gradients locally without the all-reduce (use it on
        every micro-batch of a window but the last). Mirrors ``LightningOptimizer.toggle_model``."""
        module = self._module
        with module.no_backward_sync(not sync_grad):
            module.toggle_optimizer(self)
            try:
                yield
            finally:
                module.untoggle_optimizer(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero (default: drop) the gradients of the optimizer's parameters."""
        self._optimizer.zero_grad(set_to_none=set_to_none)


@contextlib.contextmanager
def manual_outer_forward(strategy: Any) -> Iterator[None]:
    """Around a manual-optimization ``training_step`` called through ``DistributedDataParallel``: the wrapper's
    forward must not prepare the gradient reducer, since the step runs its backward passes itself and
    :func:`prepare_ddp_backward` prepares each (Lightning's ``_DDPForwardRedirection``)."""
    from torch.nn.parallel import DistributedDataParallel

    model = strategy.model
    if not isinstance(model, DistributedDataParallel):
        yield
        return
    model.require_backward_grad_sync = False
    try:
        yield
    finally:
        model.require_backward_grad_sync = True


def prepare_ddp_backward(strategy: Any, loss: Any) -> None:
    """Before a ``manual_backward`` that synchronises: arm the ``DistributedDataParallel`` reducer so this backward
    all-reduces the gradients (Lightning's ``prepare_for_backward``). A no-op without DDP."""
    from torch.nn.parallel.distributed import _find_tensors  # noqa: PLC2701 (the helper DDP itself uses)
    from torch.nn.parallel import DistributedDataParallel

    model = strategy.model
    if not isinstance(model, DistributedDataParallel) or not torch.is_grad_enabled():
        return
    model.require_forward_param_sync = True
    args = list(_find_tensors(loss)) if model.find_unused_parameters and not model.static_graph else []
    model.reducer._rebuild_buckets()  # as Lightning: avoids an internal assert with find_unused_parameters=False
    model.reducer.prepare_for_backward(args)
