"""Callbacks: base class, early stopping, progress bar, throughput monitor."""

from taskfit.callbacks.base import Callback, HookRunner
from taskfit.callbacks.early_stopping import EarlyStopping, EarlyStoppingCallback
from taskfit.callbacks.progress import ProgressBar
from taskfit.callbacks.throughput import ThroughputMonitor

__all__ = ["Callback", "EarlyStopping", "EarlyStoppingCallback", "HookRunner", "ProgressBar", "ThroughputMonitor"]
