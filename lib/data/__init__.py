"""Data handling: DataModule, loader building and seeded samplers."""

from taskfit.data.loaders import DataModule, build_dataloader, set_loader_epoch
from taskfit.data.samplers import EpochRandomSampler, LengthGroupedSampler

__all__ = ["DataModule", "EpochRandomSampler", "LengthGroupedSampler", "build_dataloader", "set_loader_epoch"]
