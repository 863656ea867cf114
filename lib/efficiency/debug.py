"""``debug="underflow_overflow"`` (F-LOOP-8): stop at the first module whose weights or outputs hold inf/NaN.

Mirrors ``transformers.debug_utils.DebugUnderflowOverflow``: forward hooks on every module record the absolute
min/max of its weights, inputs and outputs in a ring buffer of the last ``max_frames`` frames; when a tensor holds
inf or NaN the hooks raise with that report, naming the module. Each check syncs with the host: a debugging aid,
not for production runs.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn

_HANDLES = "_taskfit_underflow_overflow_handles"


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return [t for t in (getattr(value, k, None) for k in ("logits", "last_hidden_state", "loss"))
            if isinstance(t, torch.Tensor)]


def _describe(tensors: list[torch.Tensor]) -> tuple[str, bool]:
    parts, bad = [], False
    for t in tensors:
        t = t.detach()
        finite = bool(torch.isfinite(t).all()) if t.numel() else True
        bad |= not finite
        a = t.abs().float()
        parts.append(f"{float(a.min()):.2e} {float(a.max()):.2e}" if t.numel() else "empty")
    return " | ".join(parts), bad


class DebugUnderflowOverflow:
    """Attach inf/NaN detection to every submodule of ``model``.

    Args:
        model (nn.Module): the module to watch.
        max_frames (int): frames (one per module forward) kept for the report (HF ``max_frames_to_save``, 21).

    Raises (from the hooks, during a forward):
        ValueError: a module's weights, inputs or outputs contain inf/NaN; the message names the module and shows
            the last frames (abs min / abs max per tensor).
    """

    def __init__(self, model: nn.Module, max_frames: int = 21) -> None:
        self.frames: collections.deque[str] = collections.deque(maxlen=max_frames)
        names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
        handles = [m.register_forward_hook(self._hook(names[id(m)])) for m in model.modules()]
        setattr(model, _HANDLES, handles)

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            weights, bad_w = _describe([p for p in module.parameters(recurse=False)])
            ins, bad_i = _describe(_tensors(inputs))
            outs, bad_o = _describe(_tensors(output))
            self.frames.append(f"{name} ({type(module).__name__}): weights [{weights}] inputs [{ins}] "
                               f"outputs [{outs}]")
            if bad_w or bad_i or bad_o:
                where = "weights" if bad_w else "inputs" if bad_i else "outputs"
                raise ValueError(f"debug='underflow_overflow': inf/NaN detected in the {where} of {name} "
                                 f"({type(module).__name__}). Last frames (abs min abs max per tensor):\n"
                                 + "\n".join(self.frames))
        return hook

    @staticmethod
    def remove(model: nn.Module) -> None:
        """Detach the hooks again."""
        for h in getattr(model, _HANDLES, []):
            h.remove()
        if hasattr(model, _HANDLES):
            delattr(model, _HANDLES)
