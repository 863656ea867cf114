"""Where this process sits: :class:`Topology`, the read-through of the strategy's ranks that ``Fit`` and ``Engine``
share (mirrors Lightning's ``Trainer.is_global_zero``/``global_rank``/``local_rank``/``node_rank``/``world_size``)."""

from __future__ import annotations

from typing import Any


class Topology:
    """Where this process sits, read from ``self.strategy`` (shared by ``Fit`` and ``Engine``; Lightning's
    ``is_global_zero``/``global_rank``/``local_rank``/``node_rank``/``world_size``)."""

    strategy: Any

    @property
    def node_rank(self) -> int:
        """Index of this machine (0-based)."""
        return self.strategy.node_rank

    @property
    def is_global_zero(self) -> bool:
        """True on the process with global rank 0."""
        return self.strategy.is_global_zero

    @property
    def global_rank(self) -> int:
        """Index of this process among all processes (0-based)."""
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        """Index of this process on its machine (0-based)."""
        return self.strategy.local_rank

    @property
    def world_size(self) -> int:
        """Number of processes taking part."""
        return self.strategy.world_size

    @property
    def device_mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` (``strategy="model_parallel"``); None for strategies without one."""
        return self.strategy.device_mesh
