"""Tuning around ``Fit``: the learning-rate finder, batch-size scaling and hyperparameter search."""

from taskfit.tuner.tuner import LRFinder, lr_find, scale_batch_size

__all__ = ["LRFinder", "lr_find", "scale_batch_size"]
