"""Precision plugins: numerics only (dtype conversion, autocast, backward, optimizer step).

Mirrors Lightning's ``Precision`` plugins; names as in Lightning (``"32-true"``, ``"bf16-mixed"``, ...).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch


class Precision:
    """Full fp32 precision (``"32-true"``): the base plugin that every other one refines.

    Hooks are called by the strategy in this order per optimizer step: :meth:`forward_context` around each
    ``training_step``, :meth:`backward` per micro-batch, :meth:`unscale_gradients` before clipping, then
    :meth:`optimizer_step`.
    """

    name = "32-true"
    #: dtype parameters are converted to by :meth:`convert_module`; ``None`` leaves them as they are
    param_dtype: torch.dtype | None = None

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast ``module``'s floating-point parameters and buffers to :attr:`param_dtype` (in place)."""
        return module.to(dtype=self.param_dtype) if self.param_dtype is not None else module

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors of a batch to :attr:`param_dtype` (true-precision plugins only)."""
        if self.param_dtype is None:
            return data
        from lightning_utilities.core.apply_func import apply_to_collection

        dtype = self.param_dtype
        return apply_to_collection(data, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)

    def forward_context(self, device_type: str = "cpu") -> ContextManager:
        """Context for forward passes (autocast for mixed precision). A no-op here."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (a scalar tensor)."""
        loss.backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Undo loss scaling before gradient clipping (only scaling plugins do anything)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Run ``optimizer.step()``; returns False when the step was skipped (non-finite scaled gradients)."""
        optimizer.step()
        return True

    def state_dict(self) -> dict[str, Any]:
        """Plugin state for checkpoints (e.g. the loss scaler); empty for plugins without state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class DoublePrecision(Precision):
    """``"64-true"``: parameters, buffers and floating-point inputs in float64."""

    name = "64-true"
    param_dtype = torch.float64


class HalfTruePrecision(Precision):
    """``"bf16-true"``: parameters and floating-point inputs in bfloat16, no fp32 master copy."""

    name = "bf16-true"
    param_dtype = torch.bfloat16


class MixedPrecision(Precision):
    """``"bf16-mixed"``: fp32 parameters, forward under ``torch.autocast(dtype=torch.bfloat16)``.

    Mirrors Lightning's ``MixedPrecision("bf16-mixed")`` and HF ``bf16=True``. bfloat16 has fp32's exponent
    range, so no loss scaling is needed; ``16-mixed`` (fp16 + GradScaler) lands with the precision issue.
    """

    name = "bf16-mixed"

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype

    def forward_context(self, device_type: str = "cpu") -> ContextManager:
        return torch.autocast(device_type=device_type, dtype=self.dtype)
