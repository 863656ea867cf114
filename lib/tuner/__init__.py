"""Tuning around ``Fit``: the learning-rate finder, batch-size scaling and hyperparameter search, and Lightning's
``LearningRateFinder`` / ``BatchSizeFinder`` callbacks that run them inside ``fit``."""

from taskfit.tuner.finders import BatchSizeFinder, LearningRateFinder
from taskfit.tuner.tuner import LRFinder, lr_find, scale_batch_size

__all__ = ["BatchSizeFinder", "LRFinder", "LearningRateFinder", "lr_find", "scale_batch_size"]
