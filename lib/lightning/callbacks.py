"""Lightning's built-in callbacks under Lightning's names (``lightning.pytorch.callbacks``): swap
``from lightning.pytorch.callbacks import X`` for ``from taskfit.lightning.callbacks import X``."""

from taskfit.callbacks import (
    BatchSizeFinder, DeviceStatsMonitor, EarlyStopping, EMAWeightAveraging, GradientAccumulationScheduler,
    LearningRateFinder, LearningRateMonitor, ModelCheckpoint, ModelSummary, ProgressBar, RichProgressBar,
    StochasticWeightAveraging, ThroughputMonitor, Timer, WeightAveraging,
)
from taskfit.callbacks.base import Callback
from taskfit.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from taskfit.callbacks.lambda_callback import LambdaCallback
from taskfit.callbacks.progress import TQDMProgressBar

__all__ = ["BackboneFinetuning", "BaseFinetuning", "BatchSizeFinder", "Callback", "DeviceStatsMonitor",
           "EarlyStopping", "EMAWeightAveraging", "GradientAccumulationScheduler", "LambdaCallback",
           "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary", "ProgressBar",
           "RichProgressBar", "StochasticWeightAveraging", "TQDMProgressBar", "ThroughputMonitor", "Timer",
           "WeightAveraging"]
