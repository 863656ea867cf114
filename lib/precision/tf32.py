"""TF32 switches (F-PREC-2): HF ``TrainingArguments.tf32``."""

from __future__ import annotations

from typing import Any

import torch


def apply_tf32(tf32: bool | None, device: torch.device, accelerator: Any = None) -> dict[str, bool] | None:
    """Set the TF32 flags for CUDA matmuls and cuDNN convolutions as ``TrainingArguments.tf32`` does, through
    the accelerator (:meth:`Accelerator.set_tf32`).

    ``True`` switches TF32 on (float32 matmuls then use TF32 tensor cores: 10-bit mantissa, fp32 range);
    ``False`` switches it off; ``None`` leaves PyTorch's defaults alone. The flags are process-wide.

    Args:
        tf32 (bool | None): the option value.
        device (torch.device): the device training runs on.
        accelerator (Accelerator): the run's accelerator (it owns the switches; ``set_tf32``).

    Returns:
        dict[str, bool] | None: ``{"matmul": bool, "cudnn": bool}`` as set (for the run summary), or None when
        ``tf32`` is None.

    Raises:
        ValueError: ``tf32`` is True or False on a device that is not CUDA, or True on a CUDA GPU older than
            Ampere (compute capability < 8.0); the message names the device.
        TypeError: ``tf32`` is set but no accelerator is given.
    """
    if tf32 is None:
        return None
    if accelerator is None:
        raise TypeError(f"apply_tf32(tf32={tf32!r}) needs the run's accelerator, which owns the TF32 switches.")
    return accelerator.set_tf32(bool(tf32), torch.device(device))
