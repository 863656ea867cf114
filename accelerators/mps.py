"""Apple-silicon GPU accelerator (F-ACC-1, F-ACC-3): one ``mps`` device, one process."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

from taskfit.accelerators.accelerator import Accelerator
from taskfit.accelerators.cuda import parse_gpu_devices

#: strategy names that start several processes, all refused on MPS (one device, no collective backend)
MULTI_PROCESS_STRATEGIES = ("ddp", "ddp_spawn", "fsdp", "fsdp2", "deepspeed", "dp", "xla", "xla_fsdp")

FALLBACK_HINT = ("Set PYTORCH_ENABLE_MPS_FALLBACK=1 (before starting Python) to run operators that MPS lacks on the "
                 "CPU, or use accelerator='cpu'.")


def _macos_at_least(major: int, minor: int = 0) -> bool:
    check = getattr(torch.backends.mps, "is_macos_or_newer", None)
    try:
        return bool(check(major, minor)) if check is not None else False
    except Exception:  # not a Mac
        return False


class MPSAccelerator(Accelerator):
    """The Metal GPU of Apple silicon (mirrors Lightning's ``MPSAccelerator``).

    MPS exposes one device to one process and has no collective backend, so ``devices`` may only name that
    device and multi-process strategies are refused (:meth:`check_strategy`). Precision rules of the PyTorch MPS
    backend (:meth:`check_precision`): float16 and ``16-mixed`` (with ``GradScaler("mps")``) work; bfloat16 needs
    macOS 14 or newer; float64 does not exist on MPS.
    """

    name = "mps"

    @staticmethod
    def is_available() -> bool:
        """``torch.backends.mps.is_available()`` (an Apple-silicon Mac with a PyTorch built for MPS)."""
        return torch.backends.mps.is_available()

    @staticmethod
    def auto_device_count() -> int:
        """Always 1: MPS has one device."""
        return 1

    @classmethod
    def parse_devices(cls, devices: Any) -> list[torch.device]:
        """Parse ``devices``: ``"auto"``/``None``/``-1``/``1``/``[0]`` all mean the one MPS device.

        Raises:
            ValueError: anything asking for more than one device ("MPS supports a single device") or malformed.
        """
        try:
            indices = parse_gpu_devices("MPS", devices, 1)
        except ValueError as err:
            raise ValueError(f"{err} MPS supports a single device in a single process: use devices=1 (or 'auto') "
                             "and no multi-process strategy.") from None
        return [torch.device("mps", i) for i in indices]

    @staticmethod
    def check_strategy(strategy_name: str | None) -> None:
        """Refuse a strategy that needs several processes (``ddp``, ``fsdp``, ``deepspeed``, ...), before any work.

        Raises:
            ValueError: naming the strategy and saying MPS supports a single process.
        """
        if strategy_name and strategy_name.split("_stage")[0] in MULTI_PROCESS_STRATEGIES:
            raise ValueError(f"strategy={strategy_name!r} cannot run on MPS: MPS supports a single process on a "
                             "single device (no collective backend). Use strategy='auto' (single device) with "
                             "accelerator='mps', or accelerator='cpu' for multi-process training.")

    def check_precision(self, precision: Any) -> None:
        """Refuse precisions the MPS backend cannot run (PyTorch MPS backend rules), with MPS-specific messages.

        Args:
            precision (Precision): the plugin (its dtypes are checked).

        Raises:
            ValueError: a float64 precision (MPS has no float64), or a bfloat16 one on macOS older than 14.
        """
        dtypes = {precision.param_dtype, precision.autocast_dtype, precision.compute_dtype}
        name = precision.name
        if torch.float64 in dtypes:
            raise ValueError(f"precision={name!r} cannot run on MPS: the MPS backend has no float64. Use "
                             "'32-true', '16-mixed' or accelerator='cpu'.")
        if torch.bfloat16 in dtypes and not self.supports_dtype(torch.bfloat16):
            raise ValueError(f"precision={name!r} needs bfloat16 on MPS, which needs macOS 14 or newer; use "
                             "'16-mixed' or '32-true'.")

    @staticmethod
    def with_fallback_hint(err: BaseException) -> BaseException:
        """Return ``err`` itself, or for an operator MPS lacks (``NotImplementedError`` mentioning MPS while
        ``PYTORCH_ENABLE_MPS_FALLBACK`` is not ``1``) a ``NotImplementedError`` whose message adds the
        ``PYTORCH_ENABLE_MPS_FALLBACK=1`` hint (its ``__cause__`` is ``err``)."""
        if (isinstance(err, NotImplementedError) and "mps" in str(err).lower()
                and os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK") != "1" and FALLBACK_HINT not in str(err)):
            new = NotImplementedError(f"{err}\n{FALLBACK_HINT}")
            new.__cause__ = err
            return new
        return err

    @classmethod
    @contextlib.contextmanager
    def missing_op_hint(cls) -> Iterator[None]:
        """Context manager: re-raise a missing-operator ``NotImplementedError`` with :data:`FALLBACK_HINT`
        (see :meth:`with_fallback_hint`); other exceptions pass unchanged."""
        try:
            yield
        except NotImplementedError as err:
            new = cls.with_fallback_hint(err)
            if new is err:
                raise
            raise new from err

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is the MPS device.

        Raises:
            ValueError: ``device`` is not ``mps``.
        """
        if torch.device(device).type != "mps":
            raise ValueError(f"MPSAccelerator cannot set up device {device}; expected the mps device.")

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """``mps_memory_allocated_bytes`` (tensors), ``mps_memory_driver_bytes`` (all Metal allocations) and
        ``mps_memory_recommended_max_bytes`` (the working-set limit), in bytes, from ``torch.mps``."""
        stats: dict[str, float] = {}
        for key, fn in (("mps_memory_allocated_bytes", "current_allocated_memory"),
                        ("mps_memory_driver_bytes", "driver_allocated_memory"),
                        ("mps_memory_recommended_max_bytes", "recommended_max_memory")):
            try:
                stats[key] = float(getattr(torch.mps, fn)())
            except Exception:  # older torch or not on a Mac: stats must never stop a run
                pass
        return stats

    def teardown(self) -> None:
        """Release cached Metal memory (``torch.mps.empty_cache``) when MPS is in use."""
        self.empty_cache()

    def get_rng_state(self) -> torch.Tensor | None:
        """The MPS generator's state (``torch.mps.get_rng_state``); None where MPS is absent."""
        return torch.mps.get_rng_state() if self.is_available() else None

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Restore :meth:`get_rng_state` output (``torch.mps.set_rng_state``)."""
        if state is not None and self.is_available():
            torch.mps.set_rng_state(state)

    def memory_stats(self, device: torch.device) -> dict[str, int]:
        """``allocated`` in bytes (``torch.mps.current_allocated_memory``; MPS keeps no peak counter)."""
        try:
            return {"allocated": int(torch.mps.current_allocated_memory())}
        except Exception:  # not on a Mac: stats must never stop a run
            return {}

    def empty_cache(self) -> None:
        """``torch.mps.empty_cache`` when MPS is available."""
        if self.is_available():
            torch.mps.empty_cache()

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        """No float64 on MPS; bfloat16 needs macOS 14 or newer."""
        if dtype == torch.float64:
            return False
        return _macos_at_least(14) if dtype == torch.bfloat16 else True

    def supports_loss_scaling(self) -> bool:
        """True: ``torch.amp.GradScaler("mps")``."""
        return True
