"""Several loaders read as one (Lightning's ``CombinedLoader``): a training ``train_dataloader`` that returns a list
or a dict of loaders gives batches that are a list or dict with one batch per loader ("max_size_cycle": the longest
loader sets the epoch's length, the shorter ones start over)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

from torch.utils.data import DataLoader

#: Lightning's modes, in its order (its error message lists them)
MODES = ("min_size", "max_size_cycle", "max_size", "sequential")


def _leaves(iterables: Any) -> list[Any]:
    if isinstance(iterables, Mapping):
        return list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        return list(iterables)
    return [iterables]


def _rebuild(iterables: Any, leaves: list[Any]) -> Any:
    if isinstance(iterables, Mapping):
        return dict(zip(iterables.keys(), leaves))
    if isinstance(iterables, (list, tuple)):
        return type(iterables)(leaves)
    return leaves[0]


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


class CombinedLoader:
    """Iterate several iterables (a list, tuple or dict of loaders; a single one too) together; mirrors
    ``lightning.pytorch.utilities.CombinedLoader``. Iterating yields ``(batch, batch_idx, dataloader_idx)``:

    - ``"min_size"``: until the shortest ends; ``batch`` has the structure of ``iterables`` (one batch each);
    - ``"max_size_cycle"``: until the longest ends, the shorter ones starting over when they run out;
    - ``"max_size"``: until the longest ends, None for the ones that ran out;
    - ``"sequential"``: one iterable after the other; ``batch`` is one iterable's batch, ``dataloader_idx`` its
      position.

    Args:
        iterables (Any): the loaders (any iterables).
        mode (str): one of the modes above (default ``"min_size"``, Lightning's).

    Raises:
        ValueError: an unknown ``mode`` (Lightning's message, which names the valid ones).
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables, self._mode = iterables, mode

    @property
    def iterables(self) -> Any:
        """The iterables as given (with :attr:`flattened` replaced, that structure with the new leaves)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list."""
        return _leaves(self._iterables)

    @flattened.setter
    def flattened(self, leaves: list[Any]) -> None:
        self._iterables = _rebuild(self._iterables, list(leaves))

    def __len__(self) -> int:
        """Batches per pass (``TypeError`` when an iterable has no length)."""
        lengths = [_length(x) for x in self.flattened]
        if any(n is None for n in lengths):
            raise TypeError("CombinedLoader: an iterable has no length")
        if self._mode == "sequential":
            return sum(lengths)
        return (min if self._mode == "min_size" else max)(lengths) if lengths else 0

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        if self._mode == "sequential":
            for idx, loader in enumerate(self.flattened):
                for i, batch in enumerate(loader):
                    yield batch, i, idx
            return
        leaves = self.flattened
        its = [iter(x) for x in leaves]
        done = [False] * len(its)
        i = 0
        while its:
            out = []
            for k, it in enumerate(its):
                try:
                    out.append(next(it))
                    continue
                except StopIteration:
                    done[k] = True
                if self._mode == "min_size" or all(done):
                    return
                if self._mode == "max_size":
                    out.append(None)
                    continue
                its[k] = iter(leaves[k])  # max_size_cycle: start this one over
                out.append(next(its[k]))
            if self._mode == "max_size" and all(done):
                return
            yield _rebuild(self._iterables, out), i, 0
            i += 1


class CombinedBatches:
    """The batches of a :class:`CombinedLoader` (without ``batch_idx``/``dataloader_idx``), as the fit loop reads a
    loader: ``len``, ``set_epoch`` told to every inner loader's sampler, ``release`` of their workers."""

    def __init__(self, combined: CombinedLoader) -> None:
        self.combined = combined

    def __iter__(self) -> Iterator[Any]:
        return (batch for batch, _, _ in self.combined)

    def __len__(self) -> int:
        return len(self.combined)

    def set_epoch(self, epoch: int) -> None:
        from taskfit.data.loaders import set_loader_epoch

        for inner in self.combined.flattened:
            set_loader_epoch(inner, epoch)

    def release(self) -> None:
        """Shut the inner loaders' kept worker processes down (``taskfit.data.loaders.shutdown_workers``)."""
        from taskfit.data.loaders import shutdown_workers

        for inner in self.combined.flattened:
            shutdown_workers(inner)


def is_loader_collection(data: Any) -> bool:
    """True for a :class:`CombinedLoader`, or a non-empty list, tuple or dict of ``DataLoader``s (Lightning's
    several train loaders; a list of samples stays a dataset)."""
    if isinstance(data, CombinedLoader):
        return True
    leaves = list(data.values()) if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else []
    return bool(leaves) and all(isinstance(x, DataLoader) for x in leaves)


def combined_train_loader(data: Any, prepare: Callable[[Any], Any]) -> CombinedBatches:
    """The training loader of several loaders: ``data`` (a :class:`CombinedLoader`, else a list/dict of loaders in
    ``"max_size_cycle"`` mode, as Lightning's fit loop) with ``prepare`` applied to each inner loader (the
    strategy's sampler...)."""
    combined = data if isinstance(data, CombinedLoader) else CombinedLoader(data, "max_size_cycle")
    combined = CombinedLoader(combined.iterables, combined._mode)  # the caller's object stays as given
    combined.flattened = [prepare(x) for x in combined.flattened]
    return CombinedBatches(combined)
