"""Accelerators (device kinds) and their registry: ``ACCELERATORS.build("cpu")``."""

from taskfit.accelerators.accelerator import Accelerator
from taskfit.accelerators.cpu import CPUAccelerator
from taskfit.registry import Registry

ACCELERATORS = Registry("accelerator")
ACCELERATORS.register("cpu", CPUAccelerator, description="CPU processes")
for _name in ("cuda", "gpu", "mps", "xla", "tpu"):
    ACCELERATORS.register(_name, CPUAccelerator, pending="lands with the accelerators issue (#6)")

__all__ = ["ACCELERATORS", "Accelerator", "CPUAccelerator"]
