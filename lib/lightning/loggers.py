"""Lightning's loggers with Lightning's constructor arguments (``lightning.pytorch.loggers``): swap
``from lightning.pytorch.loggers import X`` for ``from taskfit.lightning.loggers import X``."""

from __future__ import annotations

from typing import Any, Callable

from taskfit.loggers.lightning_style import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from taskfit.loggers.logger import Logger

__all__ = ["CSVLogger", "DummyExperiment", "DummyLogger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]


class DummyExperiment:
    """An experiment that accepts any call and any item (``logger.experiment.add_histogram(...)``,
    ``experiment[0]``) and does nothing: Lightning's ``_DummyExperiment``."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Do nothing."""

    def __getattr__(self, _: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, idx: int) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any, **kwargs: Any) -> None:
        pass


class DummyLogger(Logger):
    """The logger ``Trainer(fast_dev_run=...)`` puts in place of the given ones: it writes nothing, but user code
    that calls ``self.logger.experiment.<anything>(...)`` or any logger method still runs (mirrors
    ``lightning.pytorch.loggers.logger.DummyLogger``: ``name`` and ``version`` are ``""``)."""

    save_dir = None  # nothing on disk: a checkpoint folder falls back to default_root_dir (Lightning's rule)
    log_dir = None

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        """The experiment object that accepts any call."""
        return self._experiment

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is written."""

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is written."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return ""

    @property
    def version(self) -> str:
        return ""

    def __getitem__(self, idx: int) -> DummyLogger:
        return self

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # copy/pickle probe dunders: behave as a plain object there
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> None:
            return None

        return method
