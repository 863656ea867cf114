"""Samplers whose order depends only on ``(seed, epoch)``, so an epoch can be replayed or resumed exactly; and the
same contract for a user's ``RandomSampler`` with its own ``generator`` (:func:`position_generator`)."""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import RandomSampler, Sampler

#: per user RandomSampler: its generator's state at the start of epoch 0, 1, ... (see position_generator)
_EPOCH_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def position_generator(sampler: Any, epoch: int, loader_draws: int = 0) -> None:
    """Set the own ``generator`` of a ``torch.utils.data.RandomSampler`` to where it stands at the start of
    ``epoch``: its state when first seen here (epoch 0) advanced by ``epoch`` whole passes of the sampler. So the
    order of an epoch depends only on the generator's initial state and the epoch, as ``EpochRandomSampler``'s
    depends on ``(seed, epoch)``: a run resumed into a later epoch (a fresh loader with a generator seeded as
    before) draws the same order as the uninterrupted run, and reading the sampler twice in one epoch (a split per
    rank that a resumed ``StatefulDataLoader`` fast-forwards) gives the same order twice. Where the generator
    serves only the sampler, the orders are those a plain loop over the loader draws. Other samplers (no own
    generator, or another class, e.g. torchdata's stateful ``RandomSampler``, which saves its generator itself) are
    left alone.

    Args:
        sampler (Sampler): any sampler.
        epoch (int): the epoch about to start (0-based).
        loader_draws (int): numbers the loader itself draws from the same generator per epoch before the sampler
            (1 when the ``DataLoader`` was built with this ``generator``: each new iterator draws its workers' base
            seed from it), so the replayed passes advance it as a plain loop over the loader does.
    """
    generator = getattr(sampler, "generator", None)
    if type(sampler) is not RandomSampler or not isinstance(generator, torch.Generator):
        return
    states = _EPOCH_STATES.setdefault(sampler, [generator.get_state()])
    while len(states) <= epoch:  # one pass draws what the sampler draws per epoch (a permutation, or n indices)
        generator.set_state(states[-1])
        for _ in range(loader_draws):  # DataLoader's iterator: its base seed, drawn before the first index
            torch.empty((), dtype=torch.int64).random_(generator=generator)
        for _ in sampler:
            pass
        states.append(generator.get_state())
    generator.set_state(states[epoch])


class EpochRandomSampler(Sampler[int]):
    """A random permutation of ``range(num_samples)`` drawn from ``torch.Generator().manual_seed(seed + epoch)``.

    Mirrors ``DistributedSampler``'s ``set_epoch`` contract for one process: the order depends on the seed and
    the epoch only, not on any global RNG, which keeps runs reproducible and resumable (F-REPRO-1).

    Args:
        num_samples (int): dataset length.
        seed (int): base seed (``data_seed`` or ``seed``).
    """

    def __init__(self, num_samples: int, seed: int = 0) -> None:
        self.num_samples, self.seed, self.epoch = int(num_samples), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch``."""
        self.epoch = int(epoch)

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + self.epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.num_samples, generator=self._generator()).tolist())

    def __len__(self) -> int:
        return self.num_samples


class LengthGroupedSampler(EpochRandomSampler):
    """Random order with similar lengths close together (``group_by_length``, mirrors HF's sampler).

    Shuffle, cut into mega-batches of ``50 * batch_size``, sort each by length (longest first) so batches need
    little padding while the order stays random between mega-batches.

    Args:
        lengths (Sequence[int]): length (tokens) of every sample.
        batch_size (int): the per-device batch size.
        seed (int): base seed.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0) -> None:
        super().__init__(len(lengths), seed)
        self.lengths = list(lengths)
        self.megabatch = max(1, 50 * int(batch_size))

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.num_samples, generator=self._generator()).tolist()
        out: list[int] = []
        for i in range(0, len(order), self.megabatch):
            out.extend(sorted(order[i:i + self.megabatch], key=lambda j: -self.lengths[j]))
        return iter(out)


class DistributedSamplerWrapper(Sampler[int]):
    """This process's share of any deterministic ``sampler``'s order: indices ``rank, rank + W, ...`` of it, padded
    by repeating its first indices so every process gets ``ceil(n / W)`` (the ``DistributedSampler`` rule, which
    the evaluation gather relies on to drop the repeats). ``set_epoch`` is passed to the wrapped sampler, so all
    processes split the same ``(seed, epoch)`` permutation (mirrors Lightning's ``DistributedSamplerWrapper``); a
    ``RandomSampler`` with its own generator gives the epoch's order of :func:`position_generator` once
    ``set_epoch`` was called, so a resumed run (and each read of the same epoch) splits the same order.

    Args:
        sampler (Sampler): the single-process sampler (``EpochRandomSampler``, ``SequentialSampler``, ...).
        num_replicas (int): world size W.
        rank (int): this process's global rank.
    """

    def __init__(self, sampler: Sampler, num_replicas: int, rank: int) -> None:
        self.sampler, self.num_replicas, self.rank = sampler, int(num_replicas), int(rank)
        self.epoch: int | None = None  # None: set_epoch never called (a user's own loop), the sampler as it runs

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        if self.epoch is not None:  # a RandomSampler's own generator: this epoch's order, however often read
            position_generator(self.sampler, self.epoch)
        indices = list(self.sampler)
        total = len(self) * self.num_replicas
        if total > len(indices):
            indices += (indices * (total // max(1, len(indices)) + 1))[: total - len(indices)]
        return iter(indices[self.rank:total:self.num_replicas])
