"""XLA accelerator (F-ACC-1): TPUs and other PJRT devices through PyTorch/XLA (``torch_xla``, extra ``xla``).

``torch_xla`` is imported lazily (inside the functions that need it) so ``import taskfit`` never pays for it and a
machine without it gets one clear error naming the extra.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache

from taskfit.accelerators.accelerator import Accelerator

_TORCH_XLA = RequirementCache(module="torch_xla")
#: PJRT device kinds torch_xla accepts in ``PJRT_DEVICE``
PJRT_DEVICES = ("TPU", "CPU", "CUDA", "NEURON")


def require_torch_xla(what: str = "The XLA accelerator") -> None:
    """Raise unless ``torch_xla`` can be imported.

    Raises:
        ModuleNotFoundError: naming ``what`` and the extra (``pip install 'taskfit[xla]'``).
    """
    if not _TORCH_XLA:
        raise ModuleNotFoundError(f"{what} needs PyTorch/XLA (torch_xla), which is not installed: pip install "
                                  "'taskfit[xla]' (torch_xla pins its torch version; see the README).")


def pjrt_device() -> str | None:
    """The configured PJRT device kind: ``PJRT_DEVICE`` (upper-cased), else ``"TPU"`` when a TPU is attached
    (``/dev/accel*`` or ``/dev/vfio/[0-9]*``, or ``TPU_ACCELERATOR_TYPE`` set), else None.

    Raises:
        ValueError: ``PJRT_DEVICE`` holds an unknown kind (names the valid choices).
    """
    value = os.environ.get("PJRT_DEVICE")
    if value:
        if value.upper() not in PJRT_DEVICES:
            raise ValueError(f"PJRT_DEVICE={value!r} is not a PJRT device kind; valid choices: "
                             f"{', '.join(PJRT_DEVICES)}.")
        return value.upper()
    if os.environ.get("TPU_ACCELERATOR_TYPE") or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return "TPU"
    return None


class XLAAccelerator(Accelerator):
    """PyTorch/XLA devices (mirrors Lightning's ``XLAAccelerator``).

    The device kind comes from ``PJRT_DEVICE`` (``TPU``, ``CPU``, ``CUDA``, ``NEURON``); when it is unset and a
    TPU is attached it is set to ``TPU`` at :meth:`setup_device`, as torch_xla itself would. ``devices`` counts
    XLA replicas (one process each); inside a process the device is ``torch_xla.device()``.
    """

    name = "xla"

    @staticmethod
    def is_available() -> bool:
        """True when ``torch_xla`` is installed and a PJRT device is configured (:func:`pjrt_device`)."""
        try:
            return bool(_TORCH_XLA) and pjrt_device() is not None
        except ValueError:
            return False

    @staticmethod
    def auto_device_count() -> int:
        """Devices of this host (``torch_xla.runtime.global_runtime_device_count()``; on a TPU host, its chips).

        Raises:
            ModuleNotFoundError: torch_xla is missing (names the extra).
        """
        require_torch_xla()
        import torch_xla.runtime as xr

        return int(xr.global_runtime_device_count())

    @classmethod
    def parse_devices(cls, devices: Any) -> list[torch.device]:
        """Parse ``devices``: a count of replicas, ``[i]`` (one given device, as Lightning), ``"auto"``/``None``/
        ``-1`` (all devices of the host).

        Returns:
            list[torch.device]: ``xla:i`` devices, one per replica process.

        Raises:
            ModuleNotFoundError: torch_xla is missing (names the extra).
            ValueError: malformed, a list of several indices, or more devices than exist.
        """
        require_torch_xla()
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if isinstance(devices, (list, tuple)):
            if len(devices) != 1 or isinstance(devices[0], bool) or not isinstance(devices[0], int):
                raise ValueError(f"devices={devices!r}: on XLA give a count of replicas, one index [i], 'auto' or "
                                 "-1; several indices are not supported (PJRT uses every device of the host).")
            available = cls.auto_device_count()
            if not 0 <= devices[0] < available:
                raise ValueError(f"devices={devices!r} names XLA device {devices[0]}, but only {available} exist.")
            return [torch.device("xla", devices[0])]
        if devices in (None, "auto") or (devices == -1 and not isinstance(devices, bool)):
            return [torch.device("xla", i) for i in range(cls.auto_device_count())]
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices={devices!r} is not valid for the XLA accelerator: give a count of replicas, "
                             "one index [i], 'auto' or -1.")
        available = cls.auto_device_count()
        if devices > available:
            raise ValueError(f"devices={devices} asks for {devices} XLA devices, but only {available} exist "
                             f"(PJRT_DEVICE={os.environ.get('PJRT_DEVICE')!r}).")
        return [torch.device("xla", i) for i in range(devices)]

    def setup_device(self, device: torch.device) -> None:
        """Set ``PJRT_DEVICE`` when a TPU is detected and it is unset (torch_xla reads it at first use).

        Raises:
            ModuleNotFoundError: torch_xla is missing (names the extra).
        """
        require_torch_xla()
        kind = pjrt_device()
        if kind is not None:
            os.environ.setdefault("PJRT_DEVICE", kind)

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """``xla_memory_used_bytes`` and ``xla_memory_limit_bytes`` (bytes, ``xm.get_memory_info``) where the
        runtime reports them (TPU, CUDA); empty otherwise."""
        try:
            import torch_xla.core.xla_model as xm

            info = xm.get_memory_info(device)
        except Exception:  # not reported on this PJRT device: stats must never stop a run
            return {}
        used = info.get("bytes_used", info.get("kb_total", 0) * 1024 - info.get("kb_free", 0) * 1024)
        limit = info.get("bytes_limit", info.get("kb_total", 0) * 1024)
        return {"xla_memory_used_bytes": float(used), "xla_memory_limit_bytes": float(limit)}

    def get_rng_state(self) -> int | None:
        """The XLA generator's seed (``xm.get_rng_state()``, an int: XLA's generator state is its seed, advanced
        with every random op); None without torch_xla. Lightning and the HF Trainer do not save it, so their
        resumed XLA runs draw different random numbers."""
        if not _TORCH_XLA:
            return None
        import torch_xla.core.xla_model as xm

        return int(xm.get_rng_state())

    def set_rng_state(self, state: int | None) -> None:
        """Restore :meth:`get_rng_state` output (``xm.set_rng_state``)."""
        if state is None:
            return
        require_torch_xla("Restoring the XLA random number generator")
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(int(state))

    def memory_stats(self, device: torch.device) -> dict[str, int]:
        """``allocated`` and ``limit`` in bytes (``xm.get_memory_info``) where the runtime reports them."""
        stats = self.get_device_stats(device)
        if not stats:
            return {}
        return {"allocated": int(stats["xla_memory_used_bytes"]), "limit": int(stats["xla_memory_limit_bytes"])}

    def supports_loss_scaling(self) -> bool:
        """False: there is no ``GradScaler`` for XLA (use ``"bf16-mixed"``)."""
        return False
