"""The accelerator interface: one device kind, no process-group or wrapping logic (DESIGN.md)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class Accelerator(ABC):
    """A device kind (CPU, CUDA, MPS, XLA). Mirrors Lightning's ``Accelerator`` interface.

    Subclasses say whether the kind exists on this machine, how ``devices=`` is parsed, how many devices
    ``"auto"`` means, how a device is prepared and what statistics it reports. Everything the rest of taskfit
    needs to know about a device kind is asked here: the device's random number generator
    (:meth:`get_rng_state`), whether pinned host memory helps (:meth:`supports_pin_memory`), memory counters
    (:meth:`memory_stats`, :meth:`reset_peak_memory_stats`), cache release (:meth:`empty_cache`) and numeric
    support (:meth:`supports_dtype`, :meth:`supports_loss_scaling`, :meth:`supports_tf32`, :meth:`set_tf32`,
    :meth:`check_precision`). The defaults describe a device kind with none of these.
    """

    #: registry name of the kind (``"cpu"``)
    name: str = ""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this device kind can run here."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` selects."""

    @classmethod
    @abstractmethod
    def parse_devices(cls, devices: Any) -> list[torch.device]:
        """Turn a ``devices=`` value (count, list of indices, ``"auto"``, ``-1``) into concrete devices.

        Raises:
            ValueError: the value is malformed or asks for more devices than exist.
        """

    def setup_device(self, device: torch.device) -> None:
        """Prepare ``device`` for use by this process (e.g. ``torch.cuda.set_device``). No-op by default."""

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """Device statistics for loggers (bytes, percent). Empty by default."""
        return {}

    def teardown(self) -> None:
        """Release what :meth:`setup_device` took and the allocator's cached memory (:meth:`empty_cache`)."""
        self.empty_cache()

    def device_name(self, device: torch.device) -> str:
        """A human-readable name of ``device`` (the GPU model on CUDA); the kind's name by default."""
        return self.name

    # -- random number generators -----------------------------------------------------------------------
    def get_rng_state(self) -> Any:
        """The state of the device kind's own random number generator(s), as plain values and CPU tensors (so
        ``torch.load(weights_only=True)`` reads it back), or None when the kind has none of its own (the CPU:
        torch's CPU generator is saved with the host states by :func:`taskfit.seed.rng_states`)."""
        return None

    def set_rng_state(self, state: Any) -> None:
        """Restore :meth:`get_rng_state` output (None: nothing to restore)."""

    # -- memory -----------------------------------------------------------------------------------------
    def supports_pin_memory(self) -> bool:
        """Whether DataLoaders should pin host memory (``dataloader_pin_memory``): only for a device that copies
        batches from host memory over a bus (CUDA). False by default."""
        return False

    def memory_stats(self, device: torch.device) -> dict[str, int]:
        """Memory counters of ``device`` in bytes: ``allocated`` (tensors now), ``peak_allocated`` (since the
        last :meth:`reset_peak_memory_stats`) and ``reserved`` (held by the caching allocator), each where the
        kind reports it; empty by default. Reading them forces no device sync."""
        return {}

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        """Start a new ``peak_allocated`` period. No-op by default."""

    def empty_cache(self) -> None:
        """Return memory cached by the device allocator to the driver (after an out-of-memory error). No-op by
        default."""

    # -- numerics ---------------------------------------------------------------------------------------
    def supports_dtype(self, dtype: torch.dtype) -> bool:
        """Whether parameters and compute in ``dtype`` (``torch.float16``, ``torch.bfloat16``, ``torch.float64``)
        run on this kind. True by default."""
        return True

    def supports_loss_scaling(self) -> bool:
        """Whether ``torch.amp.GradScaler`` exists for this kind (``"16-mixed"``). False by default."""
        return False

    def supports_tf32(self, device: torch.device) -> bool:
        """Whether float32 matmuls can use TF32 tensor cores on ``device`` (Ampere or newer GPUs). False by
        default."""
        return False

    def tf32_enabled(self) -> bool:
        """Whether TF32 matmuls are switched on for this kind (process-wide). False by default."""
        return False

    def set_tf32(self, enabled: bool, device: torch.device) -> dict[str, bool]:
        """Switch TF32 matmuls and convolutions on or off (HF ``TrainingArguments.tf32``).

        Returns:
            dict[str, bool]: the switches as set, ``{"matmul": bool, "cudnn": bool}``.

        Raises:
            ValueError: always here: TF32 applies to CUDA GPUs only (names the device kind).
        """
        raise ValueError(f"tf32={enabled!r} only applies to CUDA GPUs (Ampere or newer), but training runs on "
                         f"{self.name!r}; leave tf32 unset (None).")

    def check_precision(self, precision: Any) -> None:
        """Refuse, before any work, a precision plugin whose dtypes or loss scaling this kind cannot run.

        Args:
            precision (Precision): the plugin (its ``param_dtype``, ``autocast_dtype``, ``compute_dtype`` and
                ``loss_scaling`` are checked).

        Raises:
            ValueError: naming the precision, the missing dtype or loss scaling, and the device kind.
        """
        name = precision.name
        for dtype in (precision.param_dtype, precision.autocast_dtype, precision.compute_dtype):
            if dtype is not None and not self.supports_dtype(dtype):
                raise ValueError(f"precision={name!r} needs {dtype}, which {self.name!r} devices do not support; "
                                 "use '32-true' or another precision.")
        if precision.loss_scaling and not self.supports_loss_scaling():
            raise ValueError(f"precision={name!r} is not supported on {self.name!r} devices (no GradScaler for loss "
                             "scaling); use 'bf16-mixed'.")
