"""The accelerator interface: one device kind, no process-group or wrapping logic (DESIGN.md)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class Accelerator(ABC):
    """A device kind (CPU, CUDA, MPS, XLA). Mirrors Lightning's ``Accelerator`` interface.

    Subclasses say whether the kind exists on this machine, how ``devices=`` is parsed, how many devices
    ``"auto"`` means, how a device is prepared and what statistics it reports.
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
        """Release what :meth:`setup_device` took. No-op by default."""
