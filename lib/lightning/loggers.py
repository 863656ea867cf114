"""Lightning's loggers with Lightning's constructor arguments (``lightning.pytorch.loggers``): swap
``from lightning.pytorch.loggers import X`` for ``from taskfit.lightning.loggers import X``."""

from taskfit.loggers.lightning_style import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

__all__ = ["CSVLogger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]
