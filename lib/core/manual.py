"""The optimizer handle ``TaskModule.optimizers()`` returns (mirrors Lightning's ``LightningOptimizer``): ``step``
goes through the strategy (precision plugin: loss-scaler step and skipped steps) and calls the
``on_before_optimizer_step`` hooks; everything else reads the wrapped optimizer."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

#: the handle class made for each optimizer class (one per class, not per handle)
_HANDLE_CLASSES: dict[tuple[type, type], type] = {}


def _forwarder(name: str) -> Callable[..., Any]:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.__dict__["_optimizer"], name)(*args, **kwargs)
    forward.__name__ = name
    return forward


def _forwarder_get(name: str) -> Callable[[Any], Any]:
    return lambda self: getattr(self.__dict__["_optimizer"], name)


def _handle_class(base: type, opt_cls: type) -> type:
    """``base`` subclassed with ``opt_cls`` (``isinstance(handle, torch.optim.SGD)`` holds, as Lightning's
    ``LightningOptimizer.__init__`` does with ``self.__class__ = type(...)``); the optimizer class's own methods
    forward to the wrapped optimizer (the handle holds none of its state), so ``state_dict``, ``add_param_group``
    or ``load_state_dict`` act on the optimizer. ``base`` itself when ``opt_cls`` cannot be a second base."""
    key = (base, opt_cls)
    if key not in _HANDLE_CLASSES:
        own = {n for klass in base.__mro__ for n in vars(klass)}
        members = {n: v for klass in reversed(opt_cls.__mro__[:-1]) for n, v in vars(klass).items()
                   if n not in own and (not n.startswith("__") or n == "__repr__")}
        forward = {n: _forwarder(n) for n, v in members.items() if callable(v)}
        forward.update({n: property(_forwarder_get(n)) for n, v in members.items() if isinstance(v, property)})
        try:
            _HANDLE_CLASSES[key] = type("Lightning" + opt_cls.__name__, (base, opt_cls), forward)
        except TypeError:  # e.g. a class with an incompatible layout (__slots__, C extension)
            _HANDLE_CLASSES[key] = base
    return _HANDLE_CLASSES[key]


class LightningOptimizer:
    """A thin handle on ``optimizer`` for manual optimization. Its class is a subclass of the optimizer's
    (``isinstance(self.optimizers(), torch.optim.Adam)`` holds, as in Lightning).

    Args:
        optimizer (torch.optim.Optimizer): the run's optimizer (as the strategy returned it).
        module (TaskModule): the module whose run steps it.
        after_closure (Callable[[Optimizer], None] | None): what runs between the closure and the step (the
            fit loop's ``on_before_optimizer_step`` hooks and clipping); default: the module's hooks only.
    """

    def __new__(cls, optimizer: Any, *args: Any, **kwargs: Any) -> LightningOptimizer:
        return object.__new__(_handle_class(cls, type(optimizer)))

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
        """``optimizer.step(closure=<wrapped>, **kwargs)`` through the strategy and precision plugin, where the
        wrapped closure runs ``closure`` (if any: it computes the loss and calls ``manual_backward``), unscales
        the gradients (``"16-mixed"``) and calls the ``on_before_optimizer_step`` hooks (and, in automatic
        optimization, clipping). Mirrors Lightning's ``LightningOptimizer.step``: keyword arguments reach the
        optimizer, and an optimizer that re-evaluates the closure (``LBFGS``) may call it several times.

        Returns:
            the closure's first result (what ``torch.optim`` optimizers return; None without a closure or when
            the optimizer did not call it).

        Raises:
            TypeError: ``closure`` is not callable.
        """
        if closure is not None and not callable(closure):
            raise TypeError(f"optimizer.step(closure=...) needs a callable closure, got {type(closure).__name__}.")
        results: list[Any] = []
        module = self._module
        strategy = module._fit.strategy

        @torch.enable_grad()
        def wrapped() -> Any:
            result = closure() if closure is not None else None
            results.append(result)
            if self._after_closure is not None:  # automatic optimization: the hook and clipping, as the loop
                self._after_closure(self._optimizer)
            else:  # manual: the strategy unscales first (the one place that does), so the hooks see true gradients
                strategy.before_optimizer_step(self._optimizer, self._before_step_hooks)
            return result

        self.__dict__["stepped"] = strategy.optimizer_step(self._optimizer, wrapped, **kwargs)
        module.__dict__["_manual_steps"] = module.__dict__.get("_manual_steps", 0) + 1
        return results[0] if results else None  # none: the optimizer never called it (as Lightning)

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
