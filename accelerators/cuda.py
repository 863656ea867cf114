"""CUDA accelerator (F-ACC-1, F-ACC-2): NVIDIA GPUs through ``torch.cuda``."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache

from taskfit.accelerators.accelerator import Accelerator

_NVML = RequirementCache(module="pynvml")  # from the ``nvidia-ml-py`` distribution (extra ``cuda-stats``)


def _parse_index_list(value: Any) -> list[int] | None:
    """``[0, 2]``, ``(0,)``, ``"0,2"`` or ``"1,"`` -> indices; None when ``value`` is not a list of indices."""
    if isinstance(value, str) and "," in value:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if parts and all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def parse_gpu_devices(kind: str, devices: Any, available: int, hint: str = "") -> list[int]:
    """Turn a ``devices=`` value into GPU indices (shared by the CUDA and MPS accelerators).

    Args:
        kind (str): ``"CUDA"``/``"MPS"``, for messages.
        devices (int | str | list[int] | None): a count (``2``, ``"2"``), a list of indices (``[0, 2]``,
            ``"0,2"``), ``"auto"``/``None`` or ``-1`` (all visible devices).
        available (int): how many devices this process sees.
        hint (str): appended to errors (e.g. what ``CUDA_VISIBLE_DEVICES`` holds).

    Returns:
        list[int]: distinct device indices in the given order.

    Raises:
        ValueError: malformed value, zero/negative count other than -1, duplicate or out-of-range indices, or
            more devices than ``available`` (the message says how many exist).
    """
    usage = "give a count (2), a list of indices ([0, 1] or '0,1'), 'auto' or -1 (all)"
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    indices = _parse_index_list(devices)
    if devices in (None, "auto") or devices == -1 and not isinstance(devices, bool):
        n = available
        if n < 1:
            raise ValueError(f"devices={devices!r}: no {kind} device is visible to this process{hint}.")
        return list(range(n))
    if indices is not None:
        if not indices:
            raise ValueError(f"devices={devices!r} is empty; {usage}.")
        if len(set(indices)) != len(indices):
            raise ValueError(f"devices={devices!r} names a {kind} device twice; {usage}.")
        bad = [i for i in indices if i < 0 or i >= available]
        if bad:
            raise ValueError(f"devices={devices!r} names {kind} device(s) {bad}, but only {available} exist "
                             f"(indices 0..{available - 1}){hint}.")
        return indices
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices={devices!r} is not valid for the {kind} accelerator: {usage}.")
    if devices > available:
        raise ValueError(f"devices={devices} asks for {devices} {kind} devices, but only {available} exist{hint}.")
    return list(range(devices))


class CUDAAccelerator(Accelerator):
    """NVIDIA GPUs (mirrors Lightning's ``CUDAAccelerator``).

    Device indices are those this process sees: ``CUDA_VISIBLE_DEVICES`` (which physical GPUs, in which order)
    and ``CUDA_DEVICE_ORDER`` (``FASTEST_FIRST``, CUDA's default, or ``PCI_BUS_ID``, what ``nvidia-smi`` shows)
    are applied by the CUDA runtime before taskfit sees any device; :meth:`visible_devices` reports them for the
    start summary.
    """

    name = "cuda"

    @staticmethod
    def is_available() -> bool:
        """``torch.cuda.is_available()``."""
        return torch.cuda.is_available()

    @staticmethod
    def auto_device_count() -> int:
        """Every visible CUDA device (``torch.cuda.device_count()``), as Lightning's ``devices="auto"``."""
        return torch.cuda.device_count()

    @classmethod
    def parse_devices(cls, devices: Any) -> list[torch.device]:
        """Parse ``devices``: a count (the first N visible GPUs), a list of indices, ``"auto"``/``None``/``-1``
        (all visible GPUs).

        Returns:
            list[torch.device]: ``cuda:i`` devices, one per process.

        Raises:
            ValueError: malformed, duplicate or out-of-range indices, or more devices than exist (e.g.
                ``devices=4`` when 2 exist); the message repeats ``CUDA_VISIBLE_DEVICES`` when it is set.
        """
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return [torch.device("cuda", i) for i in parse_gpu_devices("CUDA", devices, cls.auto_device_count(), hint)]

    @staticmethod
    def visible_devices() -> dict[str, str | None]:
        """``{"CUDA_VISIBLE_DEVICES": str | None, "CUDA_DEVICE_ORDER": str | None}`` as set in the environment
        (None when unset: all GPUs, ``FASTEST_FIRST`` order)."""
        return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}

    @staticmethod
    def tf32_flags() -> dict[str, bool]:
        """The process-wide TF32 switches: ``{"matmul": bool, "cudnn": bool}`` (set by ``tf32=``, F-PREC-2,
        through :func:`taskfit.precision.apply_tf32`)."""
        return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current CUDA device (``torch.cuda.set_device``).

        Raises:
            ValueError: ``device`` is not a CUDA device.
        """
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDAAccelerator cannot set up device {device}; expected a cuda device.")
        torch.cuda.set_device(device)

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """Memory and utilisation of ``device`` for loggers.

        Returns:
            dict[str, float]: ``cuda_memory_allocated_bytes``, ``cuda_memory_reserved_bytes``,
            ``cuda_memory_peak_allocated_bytes`` (bytes, from the caching allocator); with ``nvidia-ml-py``
            installed (``pip install 'taskfit[cuda-stats]'``) also ``cuda_utilization_percent`` (percent of the
            last sample period a kernel ran, through ``torch.cuda.utilization``, which maps the index through
            ``CUDA_VISIBLE_DEVICES``).
        """
        stats = {
            "cuda_memory_allocated_bytes": float(torch.cuda.memory_allocated(device)),
            "cuda_memory_reserved_bytes": float(torch.cuda.memory_reserved(device)),
            "cuda_memory_peak_allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
        }
        if _NVML:
            try:
                stats["cuda_utilization_percent"] = float(torch.cuda.utilization(device))
            except Exception:  # NVML missing from the driver, a MIG slice, ...: stats must never stop a run
                pass
        return stats

    def teardown(self) -> None:
        """Return cached blocks to the driver (``torch.cuda.empty_cache``)."""
        self.empty_cache()

    def device_name(self, device: torch.device) -> str:
        """The GPU model (``torch.cuda.get_device_name``), e.g. ``"NVIDIA H100 80GB HBM3"``."""
        return torch.cuda.get_device_name(device)

    def get_rng_state(self) -> list[torch.Tensor] | None:
        """Every visible GPU's generator state (``torch.cuda.get_rng_state_all``); None before CUDA is
        initialised (nothing drew from it yet)."""
        return torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def set_rng_state(self, state: list[torch.Tensor] | None) -> None:
        """Restore :meth:`get_rng_state` output (``torch.cuda.set_rng_state_all``)."""
        if state is not None:
            torch.cuda.set_rng_state_all(state)

    def supports_pin_memory(self) -> bool:
        """True: batches cross the PCIe/NVLink bus, and copies from pinned memory can run asynchronously."""
        return True

    def memory_stats(self, device: torch.device) -> dict[str, int]:
        """``allocated``, ``peak_allocated``, ``reserved`` in bytes (``torch.cuda.memory_allocated``,
        ``max_memory_allocated``, ``memory_reserved``)."""
        return {"allocated": int(torch.cuda.memory_allocated(device)),
                "peak_allocated": int(torch.cuda.max_memory_allocated(device)),
                "reserved": int(torch.cuda.memory_reserved(device))}

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        """``torch.cuda.reset_peak_memory_stats``."""
        torch.cuda.reset_peak_memory_stats(device)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache`` (when CUDA was initialised)."""
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        """bfloat16 needs ``torch.cuda.is_bf16_supported()`` (Ampere or newer, or emulation); the others run."""
        return torch.cuda.is_bf16_supported() if dtype == torch.bfloat16 else True

    def supports_loss_scaling(self) -> bool:
        return True

    def supports_tf32(self, device: torch.device) -> bool:
        """Compute capability 8.0 or newer (Ampere)."""
        return torch.cuda.get_device_capability(device)[0] >= 8

    def tf32_enabled(self) -> bool:
        """``torch.backends.cuda.matmul.allow_tf32``."""
        return bool(torch.backends.cuda.matmul.allow_tf32)

    def set_tf32(self, enabled: bool, device: torch.device) -> dict[str, bool]:
        """Set ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (process-wide).

        Raises:
            ValueError: ``enabled`` on a GPU older than Ampere (names the GPU and its compute capability).
        """
        if enabled and not self.supports_tf32(device):
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(f"tf32=True needs an Ampere or newer GPU (compute capability >= 8.0); "
                             f"{torch.cuda.get_device_name(device)} has {major}.{minor}. Leave tf32 unset.")
        torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
        torch.backends.cudnn.allow_tf32 = bool(enabled)
        return self.tf32_flags()
