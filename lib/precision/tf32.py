"""TF32 switches (F-PREC-2): HF ``TrainingArguments.tf32``."""

from __future__ import annotations

import torch


def apply_tf32(tf32: bool | None, device: torch.device) -> dict[str, bool] | None:
    """Set the TF32 flags for CUDA matmuls and cuDNN convolutions as ``TrainingArguments.tf32`` does.

    ``True`` sets ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` to True
    (float32 matmuls then use TF32 tensor cores: 10-bit mantissa, fp32 range); ``False`` sets both to False;
    ``None`` leaves PyTorch's defaults alone. The flags are process-wide.

    Args:
        tf32 (bool | None): the option value.
        device (torch.device): the device training runs on.

    Returns:
        dict[str, bool] | None: ``{"matmul": bool, "cudnn": bool}`` as set (for the run summary), or None when
        ``tf32`` is None.

    Raises:
        ValueError: ``tf32`` is True or False on a device that is not CUDA, or True on a CUDA GPU older than
            Ampere (compute capability < 8.0); the message names the device.
    """
    if tf32 is None:
        return None
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"tf32={tf32!r} only applies to CUDA GPUs (Ampere or newer), but training runs on "
                         f"{device.type!r}; leave tf32 unset (None).")
    if tf32:
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            raise ValueError(f"tf32=True needs an Ampere or newer GPU (compute capability >= 8.0); "
                             f"{torch.cuda.get_device_name(device)} has {major}.{minor}. Leave tf32 unset.")
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    return {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
