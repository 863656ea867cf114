"""Precision plugins and their registry: ``PRECISIONS.build("bf16-mixed")``; TF32 switches (``tf32``)."""

import torch

from taskfit.precision.precision import (
    DoublePrecision, HalfTruePrecision, MixedPrecision, Precision, cpu_grad_scaler_supported,
)
from taskfit.precision.tf32 import apply_tf32
from taskfit.registry import Registry

PRECISIONS = Registry("precision")
PRECISIONS.register("32-true", Precision, description="fp32 everywhere")
PRECISIONS.register("64-true", DoublePrecision, description="fp64 everywhere")
PRECISIONS.register("bf16-mixed", MixedPrecision, precision="bf16-mixed",
                    description="fp32 weights, bf16 autocast")
PRECISIONS.register("16-mixed", MixedPrecision, precision="16-mixed",
                    description="fp32 weights, fp16 autocast, dynamic loss scaling (GradScaler)")
PRECISIONS.register("bf16-true", HalfTruePrecision, dtype=torch.bfloat16, description="bf16 weights and compute")
PRECISIONS.register("16-true", HalfTruePrecision, dtype=torch.float16, description="fp16 weights and compute")

__all__ = ["PRECISIONS", "DoublePrecision", "HalfTruePrecision", "MixedPrecision", "Precision", "apply_tf32",
           "cpu_grad_scaler_supported"]
