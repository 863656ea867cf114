"""Lightning's rule for the sampler of a loader read by several processes (``_process_dataloader``): a
``DistributedSampler`` that shuffles the training data with ``seed + epoch`` whatever the given loader did, and
shuffles an evaluation loader only when that one shuffled. ``Fit`` splits the given order instead
(:func:`taskfit.data.loaders.distributed_loader`); the Lightning door asks for this rule through its loop policy."""

from __future__ import annotations

import os
from typing import Any, Iterator

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler

from taskfit.data.loaders import with_sampler


class _SamplerIndices:
    """The indices a sampler yields in one pass, as a sequence (Lightning's ``_DatasetSamplerWrapper``): read on
    first access after :meth:`reset`, so each epoch splits that epoch's pass."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler, self._indices = sampler, None

    def __len__(self) -> int:
        return len(self.sampler)

    def __getitem__(self, i: int) -> Any:
        if self._indices is None:
            self._indices = list(self.sampler)
        return self._indices[i]

    def reset(self) -> None:
        self._indices = None


class SamplerSplit(DistributedSampler):
    """This process's share of any ``sampler``'s indices, split as ``DistributedSampler`` splits a dataset:
    positions shuffled with ``seed + epoch`` when ``shuffle``, padded to ``ceil(n / W)`` each, every ``W``-th taken
    from ``rank``. Mirrors Lightning's ``DistributedSamplerWrapper`` (the same positions for the same arguments).

    Args:
        sampler (Sampler): the loader's own sampler (not a ``RandomSampler``/``SequentialSampler``: those are
            replaced by a plain ``DistributedSampler`` over the dataset).
        num_replicas (int): processes reading different samples (W); rank (int): this one's index.
        shuffle (bool): shuffle the positions per epoch; seed (int): the shuffle's base seed.
    """

    def __init__(self, sampler: Sampler, num_replicas: int, rank: int, shuffle: bool, seed: int) -> None:
        super().__init__(_SamplerIndices(sampler), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)

    def set_epoch(self, epoch: int) -> None:
        """Select ``epoch``'s shuffle and tell the wrapped sampler too (when it has ``set_epoch``), as Lightning."""
        super().set_epoch(epoch)
        if callable(getattr(self.dataset.sampler, "set_epoch", None)):
            self.dataset.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.dataset.reset()
        return (self.dataset[i] for i in super().__iter__())


def shuffled_split_loader(loader: Any, num_replicas: int, rank: int, *, train: bool, overfit: bool) -> Any:
    """``loader`` rebuilt around Lightning's distributed sampler for this process: the training loader's shuffles
    (``train``), an evaluation loader's only when its sampler is a ``RandomSampler``; never under ``overfit``
    (``overfit_batches``). A ``RandomSampler``/``SequentialSampler`` becomes ``DistributedSampler(dataset)``, any
    other sampler a :class:`SamplerSplit`; the seed is ``PL_GLOBAL_SEED`` (set by ``seed_everything``), else 0, and
    the loops' ``set_epoch`` re-orders each epoch. Unchanged: one process, a loader that is not a ``DataLoader``,
    an iterable dataset, a custom ``batch_sampler``, a sampler that is already a ``DistributedSampler`` (all as
    Lightning's ``_requires_distributed_sampler``; the strategy's own split then leaves it alone). Mirrors
    Lightning's ``_process_dataloader`` / ``_get_distributed_sampler`` with ``use_distributed_sampler=True``.

    Args:
        loader (Any): the loader as given (or built from a dataset).
        num_replicas (int): processes reading different samples; rank (int): this process's index among them.
        train (bool): the training loader; overfit (bool): ``overfit_batches`` is set.

    Returns:
        Any: the rebuilt ``DataLoader`` (a torchdata ``StatefulDataLoader`` stays one), or ``loader``.
    """
    if num_replicas <= 1 or not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset) \
            or loader.batch_size is None or isinstance(loader.sampler, DistributedSampler):
        return loader
    shuffle = (train or isinstance(loader.sampler, RandomSampler)) and not overfit
    seed = int(os.getenv("PL_GLOBAL_SEED", 0))
    if isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        sampler: Sampler = DistributedSampler(loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                                              seed=seed)
    else:
        sampler = SamplerSplit(loader.sampler, num_replicas, rank, shuffle, seed)
    return with_sampler(loader, sampler)
