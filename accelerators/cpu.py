"""CPU accelerator."""

from __future__ import annotations

import os
from typing import Any

import torch

from taskfit.accelerators.accelerator import Accelerator


class CPUAccelerator(Accelerator):
    """The CPU as a device kind (mirrors Lightning's ``CPUAccelerator``).

    ``devices`` counts CPU *processes* (e.g. ``devices=2`` with a DDP strategy); each uses ``torch.device("cpu")``.
    """

    name = "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @classmethod
    def parse_devices(cls, devices: Any) -> list[torch.device]:
        """Parse ``devices``: ``"auto"``/``None`` -> 1 process, an int >= 1, or ``-1`` (one per core).

        Raises:
            ValueError: not a positive int, ``-1`` or ``"auto"``; a list of indices (meaningless on CPU).
        """
        if devices in (None, "auto"):
            n = cls.auto_device_count()
        elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            return cls.parse_devices(int(devices))
        elif isinstance(devices, bool) or not isinstance(devices, int):
            raise ValueError(f"devices={devices!r} is not valid for the CPU accelerator: give a positive number of "
                             "processes, -1 (one per core) or 'auto'.")
        elif devices == -1:
            n = os.cpu_count() or 1
        elif devices >= 1:
            n = devices
        else:
            raise ValueError(f"devices={devices!r} is not valid for the CPU accelerator: give a positive number of "
                             "processes, -1 (one per core) or 'auto'.")
        return [torch.device("cpu")] * n

    def supports_loss_scaling(self) -> bool:
        """Whether this PyTorch has ``torch.amp.GradScaler("cpu")`` (2.3 and later)."""
        try:
            torch.amp.GradScaler("cpu", enabled=True)
        except (AttributeError, TypeError, RuntimeError, ValueError):
            return False
        return True

    def get_device_stats(self, device: torch.device) -> dict[str, float]:
        """Resident set size of this process in bytes (``cpu_rss_bytes``), read from /proc where present."""
        try:
            with open("/proc/self/statm") as f:
                return {"cpu_rss_bytes": float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))}
        except (OSError, ValueError, IndexError):
            return {}
