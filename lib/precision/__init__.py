"""Precision plugins and their registry: ``PRECISIONS.build("bf16-mixed")``."""

from taskfit.precision.precision import DoublePrecision, HalfTruePrecision, MixedPrecision, Precision
from taskfit.registry import Registry

PRECISIONS = Registry("precision")
PRECISIONS.register("32-true", Precision, description="fp32 everywhere")
PRECISIONS.register("64-true", DoublePrecision, description="fp64 everywhere")
PRECISIONS.register("bf16-mixed", MixedPrecision, description="fp32 weights, bf16 autocast")
PRECISIONS.register("bf16-true", HalfTruePrecision, description="bf16 weights and compute")
PRECISIONS.register("16-mixed", Precision, pending="lands with the precision issue (#4)")
PRECISIONS.register("16-true", Precision, pending="lands with the precision issue (#4)")

__all__ = ["PRECISIONS", "DoublePrecision", "HalfTruePrecision", "MixedPrecision", "Precision"]
