"""Data handling: DataModule, loader building, seeded samplers, packing and completion-only rows."""

from taskfit.data.loaders import DataModule, build_dataloader, set_loader_epoch
from taskfit.data.packing import assistant_only_row, completion_only_row, pack_dataset, pack_indices
from taskfit.data.samplers import EpochRandomSampler, LengthGroupedSampler

__all__ = ["DataModule", "EpochRandomSampler", "LengthGroupedSampler", "assistant_only_row", "build_dataloader",
           "completion_only_row", "pack_dataset", "pack_indices", "set_loader_epoch"]
