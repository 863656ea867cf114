"""Routing TaskModule step methods through a wrapper's ``forward`` (DDP, FSDP and DeepSpeed only do their work
- gradient-sync bookkeeping, parameter all-gathers - inside ``forward``). Mirrors Lightning's
``_LightningModuleWrapperBase``."""

from __future__ import annotations

from typing import Any

from torch import nn


class StepForward(nn.Module):
    """``wrapper(name, *args)`` calls ``module.<name>(*args)`` inside ``forward``.

    Args:
        module (nn.Module): the TaskModule (registered as the submodule ``module``).
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.module, method)(*args, **kwargs)
