"""What ``Engine.setup`` and ``Engine.setup_dataloaders`` hand back: the module, optimizer and loader wrappers that
route the user's own loop through the strategy (mirrors Lightning Fabric's ``_FabricModule``,
``_FabricOptimizer`` and ``_FabricDataLoader``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn


class EngineModule(nn.Module):
    """The module ``Engine.setup`` returns: ``model(*args)`` runs the original module's ``forward`` through the
    strategy's wrapper (DDP, FSDP, the DeepSpeed engine) under the precision plugin's autocast, with floating-point
    inputs cast for true-precision plugins (``"bf16-true"``, ``"64-true"``).

    ``state_dict``/``load_state_dict`` and every attribute the wrapper lacks (``model.config``,
    ``model.generate``...) go to the original module; :attr:`module` is the original module itself.

    Args:
        wrapped (nn.Module): what the strategy's ``setup`` returned (the original module on one device).
        original (nn.Module): the module given to ``Engine.setup``.
        strategy (Strategy): the strategy that wrapped it.
    """

    def __init__(self, wrapped: nn.Module, original: nn.Module, strategy: Any) -> None:
        super().__init__()
        self._forward_module = wrapped
        self.__dict__["_original_module"] = original  # not registered: its parameters are the wrapper's
        self.__dict__["_strategy"] = strategy
        # wrappers built around ``StepForward`` take the method name first
        self.__dict__["_routes"] = wrapped is not original
        self.__dict__["_casts"] = strategy.precision.param_dtype is not None
        self.__dict__["_call"] = wrapped  # plain attribute: no nn.Module.__getattr__ on the hot path
        # fp32 on one device: no context, no cast, no routing -- the forward is the module's own call
        self.__dict__["_direct"] = not self._routes and not self._casts and \
            type(strategy.forward_context()) is contextlib.nullcontext

    @property
    def module(self) -> nn.Module:
        """The original (unwrapped) module."""
        return self._original_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._direct:
            return self._call(*args, **kwargs)
        strategy = self._strategy
        if self._casts:
            args, kwargs = strategy.precision.convert_input((args, kwargs))
        with strategy.forward_context():
            if self._routes:
                return self._call("forward", *args, **kwargs)
            return self._call(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # the original module's keys, without wrapper prefixes
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._original_module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_original_module"], name)


class EngineOptimizer:
    """The optimizer ``Engine.setup`` returns: :meth:`step` goes through the strategy (the precision plugin's loss
    scaler under ``"16-mixed"``, ``engine.step()`` under DeepSpeed); everything else is the wrapped optimizer's.

    Args:
        optimizer (torch.optim.Optimizer): the optimizer the strategy returned.
        strategy (Strategy): the strategy that set it up.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, strategy: Any) -> None:
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_strategy"] = strategy
        self.__dict__["skipped_steps"] = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimizer step through the strategy; ``closure`` (if given) is evaluated once, with gradients
        enabled, before the step, and its result returned. A step the precision plugin skipped (inf/NaN gradients
        under ``"16-mixed"``) is counted in :attr:`skipped_steps`."""
        out = None
        if closure is not None:
            with torch.enable_grad():
                out = closure()
        if not self._strategy.optimizer_step(self.optimizer):
            self.__dict__["skipped_steps"] += 1
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.optimizer, name, value)

    def __repr__(self) -> str:
        return f"EngineOptimizer({self.optimizer!r})"


class EngineDataLoader:
    """The loader ``Engine.setup_dataloaders`` returns: iterates the strategy's share of ``loader`` (a distributed
    sampler under several processes), moves each batch to the device, and calls ``sampler.set_epoch(n)`` at the
    start of the n-th pass (0-based) so shuffled orders change per epoch and agree across processes.

    Args:
        loader (Iterable): the (re-sharded) loader.
        strategy (Strategy): moves batches (``batch_to_device``).
        move_to_device (bool): False leaves batches where the loader puts them.
    """

    def __init__(self, loader: Any, strategy: Any, move_to_device: bool = True) -> None:
        self.loader, self.strategy, self.move_to_device = loader, strategy, move_to_device
        self.epoch = 0

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    @property
    def sampler(self) -> Any:
        return getattr(self.loader, "sampler", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        self.epoch += 1
        if not self.move_to_device:
            yield from self.loader
            return
        to_device = self.strategy.batch_to_device
        for batch in self.loader:
            yield to_device(batch)


def unwrap_module(obj: Any) -> nn.Module:
    """The original module of an :class:`EngineModule` (or ``obj`` itself)."""
    return obj.module if isinstance(obj, EngineModule) else obj


def unwrap_optimizer(obj: Any) -> Any:
    """The optimizer inside an :class:`EngineOptimizer` (or ``obj`` itself)."""
    return obj.__dict__["optimizer"] if isinstance(obj, EngineOptimizer) else obj
