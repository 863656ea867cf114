"""What ``self.trainer`` returns when the module runs under a plain ``Fit`` (a view with Lightning's ``Trainer``
names) or under Lightning Fabric (a view of the ``Fabric``)."""

from __future__ import annotations

from typing import Any


def is_plain_fit(obj: Any) -> bool:
    """True for a ``taskfit.Fit`` without Lightning's trainer names (not ``taskfit.lightning.Trainer``, not a
    user's own trainer object assigned to ``module.trainer``)."""
    cls = type(obj)
    return hasattr(cls, "state") and hasattr(cls, "control") and not hasattr(cls, "lightning_module")


class FabricTrainerView:
    """``self.trainer`` under Lightning Fabric: attribute reads go to the ``Fabric`` (Lightning's
    ``_TrainerFabricShim``).

    Raises:
        AttributeError: on reading a name the ``Fabric`` has not (Lightning's message).
    """

    def __init__(self, fabric: Any) -> None:
        self._fabric = fabric

    def __getattr__(self, item: str) -> Any:
        try:
            return getattr(self._fabric, item)
        except AttributeError:
            raise AttributeError(f"Your LightningModule code tried to access `self.trainer.{item}` but this attribute "
                                 "is not available when using Fabric with a LightningModule.") from None


class TrainerView:
    """What ``self.trainer`` returns: the running ``Fit`` with the names Lightning's ``Trainer`` uses.

    Every attribute of the ``Fit`` is readable through it too (``self.trainer.args``...).
    """

    def __init__(self, fit: Any) -> None:
        object.__setattr__(self, "fit", fit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fit, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.fit, name, value)

    @property
    def current_epoch(self) -> int:
        """Zero-based index of the running epoch."""
        return self.fit.state.current_epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.fit.state.global_step

    @property
    def max_steps(self) -> int:
        """The run's optimizer steps (``FitArguments.max_steps`` or the steps of ``num_train_epochs``)."""
        return self.fit.state.max_steps

    @property
    def max_epochs(self) -> int:
        """The epochs the run may start (``num_train_epochs`` rounded up)."""
        return self.fit.state.num_train_epochs

    @property
    def estimated_stepping_batches(self) -> int:
        """Optimizer steps of the whole run (what ``OneCycleLR(total_steps=...)`` needs), as Lightning's."""
        return self.fit.state.max_steps

    @property
    def num_training_batches(self) -> int | float:
        """Batches per training epoch on this process (``inf`` for a loader without length)."""
        n = self.fit.state.batches_per_epoch
        return n if n else float("inf")

    @property
    def accumulate_grad_batches(self) -> int:
        """``FitArguments.gradient_accumulation_steps``."""
        return self.fit.args.gradient_accumulation_steps

    @property
    def logger(self) -> Any:
        """The first logger, None without any."""
        return self.fit.loggers[0] if self.fit.loggers else None

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The running fit's schedulers with their ``interval``, ``frequency`` and ``monitor``."""
        run = self.fit._run
        return list(run.schedulers) if run is not None else []

    @property
    def optimizers(self) -> list[Any]:
        """The running fit's optimizers."""
        run = self.fit._run
        return list(run.optimizers) if run is not None else []

    @property
    def training(self) -> bool:
        """True while the training loop runs (not during evaluation inside ``fit``)."""
        run = self.fit._run
        return run is not None and run.stage == "fit" and run.module.training

    @property
    def sanity_checking(self) -> bool:
        """Always False: taskfit runs no sanity validation before training."""
        return False

    @property
    def num_devices(self) -> int:
        """Processes taking part."""
        return self.fit.world_size
