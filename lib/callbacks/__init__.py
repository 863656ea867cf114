"""Callbacks: base class, early stopping, checkpointing, learning-rate monitor, timer, model summary, weight
averaging (EMA, SWA), gradient-accumulation schedule, progress bars, throughput and device-stats monitors. The learning-rate and batch-size
finder callbacks run the tuner's search, so they live above it: ``taskfit.tuner.LearningRateFinder``."""

from taskfit.callbacks.accumulation import GradientAccumulationScheduler
from taskfit.callbacks.base import Callback, HookRunner
from taskfit.callbacks.device_stats import DeviceStatsMonitor
from taskfit.callbacks.early_stopping import EarlyStopping
from taskfit.callbacks.hf_early_stopping import EarlyStoppingCallback
from taskfit.callbacks.lr_monitor import LearningRateMonitor
from taskfit.callbacks.model_checkpoint import ModelCheckpoint
from taskfit.callbacks.model_summary import ModelSummary
from taskfit.callbacks.progress import ProgressBar
from taskfit.callbacks.throughput import ThroughputMonitor
from taskfit.callbacks.rich_progress import RichProgressBar
from taskfit.callbacks.swa import StochasticWeightAveraging
from taskfit.callbacks.timer import Timer
from taskfit.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = ["Callback", "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping", "EarlyStoppingCallback",
           "GradientAccumulationScheduler", "HookRunner", "LearningRateMonitor", "ModelCheckpoint", "ModelSummary", "ProgressBar",
           "RichProgressBar", "StochasticWeightAveraging", "ThroughputMonitor", "Timer",
           "WeightAveraging"]
