"""Accelerators (device kinds) and their registry: ``ACCELERATORS.build("cpu")``; :func:`choose_accelerator`
resolves ``"auto"``/``"gpu"`` (F-ACC-1)."""

from taskfit.accelerators.accelerator import Accelerator
from taskfit.accelerators.cpu import CPUAccelerator
from taskfit.accelerators.cuda import CUDAAccelerator
from taskfit.accelerators.mps import MPSAccelerator
from taskfit.accelerators.xla import XLAAccelerator, pjrt_device
from taskfit.registry import Registry

ACCELERATORS = Registry("accelerator")
ACCELERATORS.register("cpu", CPUAccelerator, description="CPU processes")
ACCELERATORS.register("cuda", CUDAAccelerator, description="NVIDIA GPUs (torch.cuda)")
ACCELERATORS.register("gpu", CUDAAccelerator, description="CUDA when available, else MPS")
ACCELERATORS.register("mps", MPSAccelerator, description="the Apple-silicon GPU (one device, one process)")
ACCELERATORS.register("xla", XLAAccelerator, description="TPU/PJRT devices through torch_xla (extra 'xla')")
ACCELERATORS.register("tpu", XLAAccelerator, description="alias of 'xla'")


def choose_accelerator(name: str) -> tuple[str, str]:
    """Resolve an accelerator name to a registry name and the reason for the start summary.

    ``"auto"`` picks CUDA, then MPS, then XLA (torch_xla installed and a PJRT device configured: ``PJRT_DEVICE``
    or an attached TPU), then CPU, as Lightning's ``_AcceleratorConnector``; ``"gpu"`` means CUDA, else MPS;
    ``"tpu"`` means ``"xla"``. Other names pass through.

    Args:
        name (str): a lower-case accelerator name.

    Returns:
        tuple[str, str]: ``(registry name, reason)``, e.g. ``("cpu", "auto: no CUDA, MPS or XLA device found")``.

    Raises:
        ValueError: ``"gpu"`` when neither CUDA nor MPS is available (names both and the valid choices).
    """
    if name == "auto":
        if CUDAAccelerator.is_available():
            return "cuda", f"auto: {CUDAAccelerator.auto_device_count()} CUDA device(s) visible"
        if MPSAccelerator.is_available():
            return "mps", "auto: no CUDA; the Apple MPS device is available"
        if XLAAccelerator.is_available():
            return "xla", f"auto: no CUDA or MPS; PJRT device {pjrt_device()} configured and torch_xla installed"
        return "cpu", "auto: no CUDA, MPS or XLA device found"
    if name == "gpu":
        if CUDAAccelerator.is_available():
            return "cuda", "accelerator='gpu': CUDA is available"
        if MPSAccelerator.is_available():
            return "mps", "accelerator='gpu': no CUDA; MPS is available"
        raise ValueError("accelerator='gpu' needs CUDA or MPS, but neither is available here; use "
                         "accelerator='cpu' or 'auto' (valid choices: auto, cpu, cuda, gpu, mps, xla, tpu).")
    if name == "tpu":
        return "xla", "accelerator='tpu' (alias of 'xla')"
    return name, f"accelerator={name!r} given"


__all__ = ["ACCELERATORS", "Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "XLAAccelerator",
           "choose_accelerator"]
