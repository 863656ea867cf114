"""Precision plugins and their registry: ``PRECISIONS.build("bf16-mixed")``; TF32 switches (``tf32``).

The registry holds the plain plugins by name; the strategies that own the numerics themselves take their own
plugin classes (:class:`FSDPPrecision`, :class:`DeepSpeedPrecision`, :class:`XLAPrecision`), which the connector
builds from the same name (:func:`build_precision`).
"""

import torch


from taskfit.precision.deepspeed import DeepSpeedPrecision
from taskfit.precision.fsdp import FSDPPrecision
from taskfit.precision.precision import (
    DoublePrecision, HalfTruePrecision, MixedPrecision, Precision, StrategyPrecision, cpu_grad_scaler_supported,
)
from taskfit.precision.xla import XLAPrecision
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



def build_precision(name: str, plugin_class: type[Precision] | None = None) -> Precision:
    """The precision plugin for ``name``: ``plugin_class(name)`` when a strategy names its own plugin class
    (``FSDPStrategy.precision_plugin`` is :class:`FSDPPrecision`, ...), else the registry's plain plugin. Mirrors
    the precision selection of Lightning Fabric's connector.

    Args:
        name (str): a precision name (``"32-true"``, ``"bf16-mixed"``, ...).
        plugin_class (type[Precision] | None): the strategy's plugin class, or None.

    Raises:
        ValueError: an unknown name, or one the strategy's plugin does not offer (with the valid choices).
    """
    entry = PRECISIONS.get(name)  # an unknown name: the registry's error with the closest match
    return entry.build() if plugin_class is None else plugin_class(name)


__all__ = ["PRECISIONS", "DeepSpeedPrecision", "DoublePrecision", "FSDPPrecision", "HalfTruePrecision",
           "MixedPrecision", "Precision", "StrategyPrecision", "XLAPrecision", "apply_tf32", "build_precision",
           "cpu_grad_scaler_supported"]
