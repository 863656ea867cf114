"""Gathering evaluation outputs across processes in dataset order (F-EVAL-2, distributed part).

Each process holds the predictions of the samples its sampler gave it (a ``DistributedSampler`` deals indices
round-robin and repeats a few at the end so every process gets as many). :func:`gather_in_dataset_order`
all-gathers the arrays and the dataset indices through the strategy's ``all_gather`` (identity for one
process), puts every sample back at its index and drops the repeated ones, so the result equals what one
process evaluating the whole dataset returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

PAD = -100


def loader_indices(loader: Any) -> list[int] | None:
    """Dataset indices a map-style DataLoader yields on this process, in batch order (its batch sampler
    iterated once, which reads no data); None for iterable datasets or loaders without a batch sampler."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None:
        return None
    try:
        return [int(i) for batch in batch_sampler for i in batch]
    except TypeError:
        return None


def _gather_array(strategy: Any, array: np.ndarray) -> list[np.ndarray]:
    """Every process's ``array`` (shapes may differ in every dimension), as a list indexed by rank."""
    device = strategy.root_device
    shape = torch.tensor([array.ndim, *array.shape], dtype=torch.long, device=device)
    ndims = strategy.all_gather(shape[:1]).flatten()
    if len(set(ndims.tolist())) != 1:
        raise ValueError(f"Evaluation outputs have different numbers of dimensions across processes: {ndims.tolist()}.")
    shapes = strategy.all_gather(shape).cpu()[:, 1:]
    biggest = tuple(int(d) for d in shapes.max(0).values)
    padded = np.full(biggest, PAD, dtype=array.dtype)
    padded[tuple(slice(0, d) for d in array.shape)] = array
    gathered = strategy.all_gather(torch.from_numpy(padded).to(device)).cpu().numpy()
    return [gathered[r][tuple(slice(0, int(d)) for d in shapes[r])] if array.ndim else gathered[r]
            for r in range(gathered.shape[0])]


def _gather_objects(array: np.ndarray) -> list[np.ndarray]:
    """Every process's object ``array`` (any picklable rows), as a list indexed by rank (mirrors accelerate's
    ``gather_object``, which HF's ``eval_use_gather_object`` selects)."""
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, array)
    return parts


def _merge(parts: list[np.ndarray], order: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Concatenate per-rank parts (padding trailing dimensions with -100), then reorder and deduplicate."""
    width = tuple(max(p.shape[d] for p in parts) for d in range(1, parts[0].ndim))
    if any(p.shape[1:] != width for p in parts):
        parts = [np.pad(p, [(0, 0)] + [(0, w - s) for s, w in zip(p.shape[1:], width)], constant_values=PAD)
                 for p in parts]
    return np.concatenate(parts, axis=0)[order][keep]


def gather_in_dataset_order(strategy: Any, value: Any, indices: list[int] | None,
                            seen: set[int] | None = None) -> Any:
    """Gather ``value`` (numpy arrays, possibly nested in tuples/lists/dicts, first dimension = this
    process's samples) from every process, in ascending dataset index order without repeats.

    Args:
        strategy (Strategy): its ``all_gather(tensor) -> (world_size, *tensor.shape)`` is used; with one
            process ``value`` is returned unchanged.
        value (Any): this process's outputs; None stays None.
        indices (list[int] | None): dataset index of each row of ``value`` on this process (from
            :func:`loader_indices`); None = keep rank-major order (iterable datasets: no repeats to drop).
        seen (set[int] | None): for batch-by-batch gathering: indices already returned by earlier batches
            (dropped here, e.g. the sampler's repeats at the end) ; updated with this call's indices.

    Returns:
        The gathered value of the same structure: rows sorted by dataset index, repeated indices dropped;
        trailing dimensions that differ between processes are padded with -100 (HF ``nested_concat`` rule).

    Raises:
        ValueError: ranks disagree on the structure's dimensions, or ``indices`` does not match the rows.
    """
    if value is None or strategy.world_size == 1:
        return value
    order = keep = None
    if indices is not None:
        idx_parts = _gather_array(strategy, np.asarray(indices, dtype=np.int64))
        all_idx = np.concatenate(idx_parts)
        order = np.argsort(all_idx, kind="stable")
        sorted_idx = all_idx[order]
        keep = np.ones(len(sorted_idx), dtype=bool)
        keep[1:] = sorted_idx[1:] != sorted_idx[:-1]
        if seen is not None:
            keep &= np.array([int(i) not in seen for i in sorted_idx], dtype=bool)
            seen.update(int(i) for i in sorted_idx[keep])

    def walk(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        array = np.atleast_1d(np.asarray(v))
        if array.dtype == object:  # strings and other objects: pickled across processes (eval_use_gather_object)
            parts = _gather_objects(array)
        else:
            parts = _gather_array(strategy, array)
        rows = sum(len(p) for p in parts)
        if order is None:
            return _merge(parts, np.arange(rows), np.ones(rows, dtype=bool))
        if rows != len(order):
            raise ValueError(f"Gathered {rows} rows but {len(order)} dataset indices.")
        return _merge(parts, order, keep)

    return walk(value)
