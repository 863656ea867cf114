"""``DistributedDataParallel`` (``strategy="ddp"`` / ``"ddp_spawn"``; F-STRAT-2). Mirrors Lightning's
``DDPStrategy`` and the HF Trainer's ``ddp_*`` options."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch.nn.parallel import DistributedDataParallel

from taskfit.strategies.parallel import ParallelStrategy
from taskfit.strategies.settings import DDPSettings
from taskfit.strategies.wrapper import StepForward


class DDPStrategy(ParallelStrategy):
    """One model replica per process; gradients all-reduced (averaged) once per accumulation window.

    Settings (:class:`~taskfit.strategies.settings.DDPSettings`, resolved by the connector from ``ddp_backend``,
    ``ddp_timeout`` (seconds), ``ddp_find_unused_parameters`` (default False), ``ddp_bucket_cap_mb`` (default
    25 MB), ``ddp_broadcast_buffers`` (default True), ``ddp_static_graph``); and from the constructor:
    ``static_graph`` (``DistributedDataParallel(static_graph=...)``; ``ddp_static_graph`` wins when set).
    """

    name = "ddp"
    settings_type = DDPSettings
    settings: DDPSettings

    def __init__(self, *args: Any, static_graph: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.static_graph = static_graph

    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``DistributedDataParallel`` from the settings."""
        s = self.settings
        kwargs: dict[str, Any] = {"find_unused_parameters": s.find_unused_parameters,
                                  "static_graph": self.static_graph}
        if s.broadcast_buffers is False:  # only when asked: newer torch deprecates the flag
            kwargs["broadcast_buffers"] = False
        if s.static_graph is not None:  # HF 5: passed only when set
            kwargs["static_graph"] = s.static_graph
        if s.bucket_cap_mb:
            kwargs["bucket_cap_mb"] = s.bucket_cap_mb
        if self.root_device.type == "cuda":
            kwargs["device_ids"] = [self.root_device.index]
        return kwargs

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert and move ``module``, then wrap it: ``DistributedDataParallel(StepForward(module))`` (the
        replicas start from rank 0's weights: DDP broadcasts them). A model the other ranks built on the meta
        device (:func:`taskfit.core.rank_zero_init.rank_zero_init`) gets uninitialised storage there first
        (``to_empty``), which that broadcast fills: no random initialisation, no weights file read but rank 0's.

        Raises:
            ValueError: rank 0's model has meta tensors.
        """
        from taskfit.strategies.rank_zero_weights import loads_from_rank_zero, materialize

        module = self.precision.convert_module(module)
        self._names_before = {}
        if loads_from_rank_zero(module, self.root_device, self.global_rank, self.world_size, self._check):
            self._names_before = {id(p): n for n, p in module.named_parameters()}
            materialize(module, self.root_device)
        return DistributedDataParallel(StepForward(module.to(self.root_device)), **self.ddp_kwargs())

    def setup_optimizers(self, module: torch.nn.Module, optimizers: list[Any]) -> list[Any]:
        """Point ``optimizers`` built over a meta-device model at the parameters ``to_empty`` put in their place
        (by name); identity for a model that was real on every rank.

        Raises:
            ValueError: an optimizer holds a parameter that is not one of ``module``'s.
        """
        from taskfit.strategies.rank_zero_weights import repoint_optimizers

        names, self._names_before = getattr(self, "_names_before", {}), {}
        return repoint_optimizers(module, optimizers, names) if names else optimizers

    def no_backward_sync(self, enabled: bool = True) -> ContextManager:
        """``DistributedDataParallel.no_sync()`` while ``enabled`` (see :meth:`Strategy.no_backward_sync`)."""
        if not enabled or not isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()
