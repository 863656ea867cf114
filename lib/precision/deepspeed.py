"""Precision under DeepSpeed (``strategy="deepspeed..."``): the engine owns the numerics (F-PREC-3)."""

from __future__ import annotations

from typing import Any

import torch

from taskfit.precision.precision import Precision

#: precision name -> DeepSpeed config section (``"bf16"``/``"fp16"``) that the engine enables; None: fp32
DS_PRECISIONS = {"32-true": None, "bf16-mixed": "bf16", "bf16-true": "bf16", "16-mixed": "fp16", "16-true": "fp16"}


class DeepSpeedPrecision(Precision):
    """Precision under DeepSpeed (mirrors Lightning's ``DeepSpeedPrecision``): the engine converts the module
    (its ``bf16``/``fp16`` config sections, chosen from this plugin's :attr:`engine_half`) and scales losses, so
    this plugin only casts floating-point inputs to the engine's dtype once the engine exists (:attr:`active`,
    set by the strategy when it builds the engine). Chosen by the connector for every DeepSpeed strategy.

    Args:
        precision (str): ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"16-mixed"`` or ``"16-true"``.

    Raises:
        ValueError: another name (``"64-true"``: DeepSpeed has no fp64 mode), with the valid choices.
    """

    def __init__(self, precision: str = "32-true") -> None:
        if precision not in DS_PRECISIONS:
            raise ValueError(f"precision={precision!r} is not supported by DeepSpeed; choose one of "
                             f"{sorted(DS_PRECISIONS)}.")
        self.name = precision
        #: the DeepSpeed config section the engine runs in: ``"bf16"``, ``"fp16"`` or None (fp32)
        self.engine_half = DS_PRECISIONS[precision]
        self.engine_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.engine_half or "")
        self.autocast_dtype = None
        self.param_dtype = None  # the module stays as it is until deepspeed.initialize converts it
        self.loss_scaling = False  # the engine scales fp16 losses itself (no GradScaler)
        self.active = False

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.engine_dtype or torch.float32

    def convert_input(self, data: Any) -> Any:
        if not self.active or self.engine_dtype is None:
            return data
        from lightning_utilities.core.apply_func import apply_to_collection

        dtype = self.engine_dtype
        return apply_to_collection(data, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)
