"""Parts of ``Fit`` that only read or change its plain attributes: process topology (the strategy's ranks),
callback management (mirrors HF ``Trainer.add_callback``/``pop_callback``/``remove_callback`` and Lightning's
``Trainer.is_global_zero``/``global_rank``/``should_stop``) and the HF-style attributes that read the current run
(``fit.model``, ``fit.optimizer``, ``fit.state``...)."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import HookRunner


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
        return getattr(self.strategy, "device_mesh", None)



class ProcessInfo(Topology):
    """``Fit``'s topology plus the HF aliases; ``should_stop`` over ``self.control``."""

    control: Any

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



class RunAttributes:
    """Read-through views of the current (or last) run (see :mod:`taskfit.fit.run`): the HF ``Trainer`` attributes
    users and callbacks read. ``_run`` is the run of the latest call of any stage, ``_last_fit`` that of the
    latest ``fit`` (its optimizers, schedulers and loaders stay readable after a later ``validate``)."""

    _run: Any
    _last_fit: Any
    _idle_state: Any
    _idle_control: Any

    @property
    def model(self) -> Any:
        """The model of the current or last run; before any, the constructor's ``model`` (None without one)."""
        return self._run.model if self._run is not None else getattr(self, "_given_model", None)

    @property
    def module(self) -> Any:
        """The TaskModule the loops drive (the model itself, or the ``ModelTaskModule`` around a plain model)."""
        return self._run.module if self._run is not None else None

    @property
    def state(self) -> Any:
        """The loop state (HF ``TrainerState`` fields) of the current or last run."""
        return self._run.state if self._run is not None else self._idle_state

    @property
    def control(self) -> Any:
        """The control flags (HF ``TrainerControl``) of the current or last run."""
        return self._run.control if self._run is not None else self._idle_control

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers of the last ``fit`` (as the strategy returned them: DeepSpeed's own, ...)."""
        return list(self._last_fit.optimizers) if self._last_fit is not None else []

    @property
    def optimizer(self) -> Any:
        """The (first) optimizer of the last ``fit`` (HF ``Trainer.optimizer``); None before any."""
        return self._last_fit.optimizer if self._last_fit is not None else None

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The LR schedulers of the last ``fit`` with their step interval and monitor (Lightning's name)."""
        return list(self._last_fit.schedulers) if self._last_fit is not None else []

    @property
    def lr_scheduler(self) -> Any:
        """The (first) LR scheduler of the last ``fit`` (HF ``Trainer.lr_scheduler``); None without one."""
        return self._last_fit.lr_scheduler if self._last_fit is not None else None

    @property
    def scheduler_interval(self) -> str:
        """When the first scheduler steps: ``"step"``, ``"epoch"`` or ``"eval"``."""
        configs = self.lr_scheduler_configs
        return configs[0].interval if configs else "step"

    @property
    def train_loader(self) -> Any:
        """The training DataLoader of the last ``fit`` (this process's share)."""
        return self._last_fit.train_loader if self._last_fit is not None else None


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
