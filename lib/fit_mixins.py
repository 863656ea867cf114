"""Parts of ``Fit`` that only read or change its plain attributes: process topology (the strategy's ranks) and
callback management (mirrors HF ``Trainer.add_callback``/``pop_callback``/``remove_callback`` and Lightning's
``Trainer.is_global_zero``/``global_rank``/``should_stop``)."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import HookRunner


class ProcessInfo:
    """Topology of the run, read from ``self.strategy``; ``should_stop`` over ``self.control``."""

    strategy: Any
    control: Any

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

    def is_world_process_zero(self) -> bool:
        """HF alias of :attr:`is_global_zero`."""
        return self.strategy.is_global_zero

    def is_local_process_zero(self) -> bool:
        """True on the first process of each machine."""
        return self.strategy.local_rank == 0

    @property
    def should_stop(self) -> bool:
        """Lightning alias of ``control.should_training_stop`` (settable)."""
        return self.control.should_training_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.control.should_training_stop = bool(value)



class CallbackManagement:
    """Adding and removing callbacks of a ``Fit`` (rebuilds its hook runner)."""

    callbacks: list[Any]
    module: Any
    _hooks: Any

    def add_callback(self, callback: Any) -> None:
        """Add a callback instance or class (instantiated without arguments), as HF ``add_callback``."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)
        self._hooks = HookRunner(self.callbacks, self.module)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback equal to ``callback`` or of that class (None if absent)."""
        for cb in self.callbacks:
            if cb is callback or (isinstance(callback, type) and isinstance(cb, callback)):
                self.callbacks.remove(cb)
                self._hooks = HookRunner(self.callbacks, self.module)
                return cb
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove the first callback equal to ``callback`` or of that class."""
        self.pop_callback(callback)
