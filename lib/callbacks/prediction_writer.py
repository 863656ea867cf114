"""``BasePredictionWriter``: write predictions per batch and/or at the end of ``predict`` (mirrors
``lightning.pytorch.callbacks.BasePredictionWriter``), with the sample indices of each batch."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.core.hooks import module_loader
from taskfit.errors import configuration_error
from torch.utils.data import DataLoader, IterableDataset

_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class IndexRecordingBatchSampler:
    """A batch sampler that yields its inner one's index lists and keeps them (``seen``, in the order drawn: batch
    ``i``'s indices are ``seen[i]``, workers prefetching or not). Mirrors Lightning's ``_IndexBatchSamplerWrapper``.

    Args:
        batch_sampler (Iterable[list[int]]): the loader's batch sampler.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.seen: list[list[int]] = []

    def __iter__(self) -> Any:
        self.seen = []
        for indices in self.batch_sampler:
            self.seen.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.batch_sampler)


def recording_loader(loader: Any) -> tuple[Any, IndexRecordingBatchSampler | None]:
    """``loader`` rebuilt around an :class:`IndexRecordingBatchSampler` (same dataset, sampler order, collate
    function and workers), and that sampler; an iterable dataset or another iterable is returned unchanged, with
    None (no indices, as Lightning)."""
    if not isinstance(loader, DataLoader) or loader.batch_sampler is None or isinstance(loader.dataset,
                                                                                       IterableDataset):
        return loader, None
    recorder = IndexRecordingBatchSampler(loader.batch_sampler)
    kwargs: dict[str, Any] = {
        "batch_sampler": recorder, "collate_fn": loader.collate_fn, "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory, "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context, "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return DataLoader(loader.dataset, **kwargs), recorder


class BasePredictionWriter(Callback):
    """Subclass it and implement :meth:`write_on_batch_end` and/or :meth:`write_on_epoch_end` to write predictions
    (files, a database) as ``predict`` runs, instead of keeping them all in memory.

    Args:
        write_interval (str): ``"batch"``, ``"epoch"`` or ``"batch_and_epoch"``: which of the two is called.

    Attributes:
        recorders (dict[int, IndexRecordingBatchSampler | None]): per loader index, the sampler that records each
            batch's sample indices in the current ``predict`` (set by ``taskfit.lightning.Trainer.predict`` through
            :func:`record_batch_indices`; None for a loader without a batch sampler: no indices, as Lightning).

    Raises:
        ValueError: another ``write_interval`` (Lightning's message; Lightning raises its
            ``MisconfigurationException``).
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in _INTERVALS:
            raise configuration_error(f"`write_interval` should be one of {list(_INTERVALS)}.")  # Lightning's words
        self.interval = write_interval
        self.recorders: dict[int, IndexRecordingBatchSampler | None] = {}
        self.predictions: dict[int, list[Any]] = {}

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: list[int] | None,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Write one batch's ``prediction`` (``batch_indices``: its samples' indices in the dataset)."""
        raise NotImplementedError()

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: list[Any],
                           batch_indices: list[Any]) -> None:
        """Write all ``predictions`` of the ``predict`` call (one list per loader when there are several), with
        ``batch_indices``: one list per loader of each batch's sample indices."""
        raise NotImplementedError()

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.predictions = {}

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self.interval != "batch":
            self.predictions.setdefault(dataloader_idx, []).append(outputs)
        if self.interval == "epoch":
            return
        recorder = self.recorders.get(dataloader_idx)
        indices = recorder.seen[batch_idx] if recorder is not None and batch_idx < len(recorder.seen) else None
        self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.interval == "batch":
            return
        loaders = sorted(set(self.predictions) | set(self.recorders))
        per = [self.predictions.get(i, []) for i in loaders]
        indices = []
        for i in loaders:
            recorder = self.recorders.get(i)
            indices.append(recorder.seen[:len(self.predictions.get(i, []))] if recorder is not None else [])
        self.write_on_epoch_end(trainer, pl_module, per[0] if len(per) == 1 else per, indices)


def record_batch_indices(dataloaders: Any, callbacks: list[Any], module: Any = None) -> Any:
    """``dataloaders`` (one loader or a list/tuple of them) rebuilt to record their batches' sample indices when
    ``callbacks`` hold a :class:`BasePredictionWriter` (each writer's ``recorders`` set); unchanged otherwise (no
    cost for a ``predict`` without a writer). With ``dataloaders`` None the loaders are ``module``'s own
    ``predict_dataloader()`` (asked for here, once), so their indices are recorded too, as Lightning records every
    predict loader's (``_IndexBatchSamplerWrapper``)."""
    writers = [cb for cb in callbacks if isinstance(cb, BasePredictionWriter)]
    if writers and dataloaders is None and module is not None:
        dataloaders = module_loader(module, "predict_dataloader")
    if not writers or dataloaders is None:
        return dataloaders
    several = isinstance(dataloaders, (list, tuple))
    pairs = [recording_loader(d) for d in (dataloaders if several else [dataloaders])]
    for writer in writers:
        writer.recorders = {i: rec for i, (_, rec) in enumerate(pairs)}
    loaders = [loader for loader, _ in pairs]
    return type(dataloaders)(loaders) if several else loaders[0]
