"""Callbacks: base class, early stopping, progress bar."""

from taskfit.callbacks.base import Callback, HookRunner
from taskfit.callbacks.early_stopping import EarlyStopping, EarlyStoppingCallback
from taskfit.callbacks.progress import ProgressBar

__all__ = ["Callback", "EarlyStopping", "EarlyStoppingCallback", "HookRunner", "ProgressBar"]
