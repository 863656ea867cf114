"""Building DataLoaders from datasets and arguments (F-CORE-5, single process part)."""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, SequentialSampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, default_collate

from taskfit.data.datamodule import DataModule  # noqa: F401  (its home before; imported from here too)
from taskfit.data.samplers import EpochRandomSampler, LengthGroupedSampler
from taskfit.io.peft_files import is_peft_model


def _check_data(data: Any, what: str) -> None:
    if isinstance(data, (DataLoader, Dataset, IterableDataset)):
        pass
    elif isinstance(data, (str, bytes, Mapping)) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        hint = (" A generator or iterator can be read only once: wrap it in a torch IterableDataset."
                if hasattr(data, "__next__") else "")
        raise TypeError(f"{what} must be a torch DataLoader, a Dataset (map-style or iterable) or a sequence of "
                        f"samples; got {type(data).__name__}.{hint}")
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError:
        return
    if n == 0:
        raise ValueError(f"{what} is empty: it has no samples (or no batches).")


class ColumnFilter:
    """Collator wrapper that drops dict keys a model's ``forward`` does not take (``remove_unused_columns``).

    Args:
        collate_fn (Callable): the collator to wrap.
        keep (set[str]): keys to keep (forward parameters plus label names).
    """

    def __init__(self, collate_fn: Callable, keep: set[str]) -> None:
        self.collate_fn, self.keep = collate_fn, keep

    def __call__(self, samples: list[Any]) -> Any:
        if samples and isinstance(samples[0], Mapping):
            samples = [{k: v for k, v in s.items() if k in self.keep} for s in samples]
        return self.collate_fn(samples)


def default_collate_with_labels(samples: list[Any]) -> Any:
    """``default_collate`` after renaming a dict sample's ``label`` / ``label_ids`` key to ``labels``, with Python
    float values batched as float32 (mirrors HF ``default_data_collator``, the HF ``Trainer``'s collator without
    a tokenizer). Dict samples holding Python lists (a pre-tokenised ``datasets.Dataset``) go to
    :func:`collate_token_lists`."""
    first = samples[0] if samples else None
    if isinstance(first, Mapping) and "labels" not in first and ("label" in first or "label_ids" in first):
        old = "label" if "label" in first else "label_ids"
        samples = [{("labels" if k == old else k): v for k, v in s.items()} for s in samples]
        first = samples[0]
    if isinstance(first, Mapping) and any(isinstance(v, (list, tuple)) for v in first.values()):
        return collate_token_lists(samples)
    if isinstance(first, Mapping) and any(type(v) is float for v in first.values()):
        # Python floats become float32 (torch's default dtype) as in HF's collator, not float64
        return {k: torch.tensor([s[k] for s in samples]) if type(v) is float
                else default_collate([s[k] for s in samples]) for k, v in first.items()}
    return default_collate(samples)


def collate_token_lists(samples: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Dict samples whose fields are Python lists (``{"input_ids": [5, 9, 2], ...}``) as one batch of tensors of
    shape ``(batch, length)``: ``transformers.default_data_collator`` when transformers is installed (HF's
    ``Trainer`` collator without a tokenizer; ``label``/``label_ids`` become ``labels``, string and None fields
    are left out), else the same rule here (lists, numbers and arrays become tensors, tensors are stacked).

    Raises:
        ValueError: rows of different lengths (a list per field cannot be one rectangular tensor); the message
            names the padding and flattening collators that batch such rows.
    """
    try:
        try:
            from transformers import default_data_collator
        except ImportError:  # the same rule without transformers
            return _tensorise(samples)
        return default_data_collator(list(samples), return_tensors="pt")
    except ValueError as exc:
        raise ValueError(f"Cannot batch rows whose fields are lists of different lengths ({exc}); pass a "
                         "data_collator that pads (transformers.DataCollatorWithPadding or "
                         "DataCollatorForLanguageModeling with a tokenizer) or flattens them "
                         "(transformers.DataCollatorWithFlattening).") from None


def _tensorise(samples: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    first = samples[0]
    renamed = {"label": "labels", "label_ids": "labels"}
    batch = {}
    for key, value in first.items():
        if value is None or isinstance(value, str) or (key in renamed and "labels" in first):
            continue
        values = [s[key] for s in samples]
        batch[renamed.get(key, key)] = (torch.stack(values) if isinstance(value, torch.Tensor)
                                        else torch.tensor(values))
    return batch


def forward_parameter_names(model: torch.nn.Module) -> set[str] | None:
    """Named parameters of ``model.forward`` (``*args``/``**kwargs`` ignored, as HF's Trainer does), or None
    when it has no named parameter at all (then nothing is removed). A PEFT model is read through its base model, as
    HF's Trainer does (``PeftModel.forward`` shows no named parameter, which would keep every column)."""
    if is_peft_model(model):
        model = model.get_base_model()
    params = inspect.signature(model.forward).parameters.values()
    names = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return names or None


def _lengths(dataset: Any, column: str) -> list[int]:
    first = dataset[0]
    if isinstance(first, Mapping) and column in first:
        return [int(dataset[i][column]) for i in range(len(dataset))]
    if isinstance(first, Mapping) and "input_ids" in first:
        return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    raise ValueError(f"group_by_length=True needs a {column!r} or 'input_ids' field in the dataset's samples.")


def build_dataloader(data: Any, args: Any, *, train: bool, batch_size: int, collate_fn: Callable | None = None,
                     keep_columns: Iterable[str] | None = None, what: str = "dataset",
                     pin_memory_supported: bool = False) -> DataLoader | Any:
    """Return a DataLoader for ``data`` (a DataLoader is returned unchanged).

    Training loaders of map-style datasets use :class:`EpochRandomSampler` (or :class:`LengthGroupedSampler`
    with ``group_by_length``) seeded with ``data_seed`` or ``seed``; evaluation loaders keep dataset order.
    ``dataloader_num_workers``, ``dataloader_pin_memory`` (pinned only when ``pin_memory_supported``: the run's
    accelerator copies batches from host memory, i.e. CUDA; on the CPU, MPS (unified memory) and XLA the
    flag has no effect, as PyTorch's DataLoader itself ignores it without a device to pin for),
    ``dataloader_persistent_workers``, ``dataloader_prefetch_factor`` and ``dataloader_drop_last`` (training,
    and evaluation of map-style datasets) are honoured, as in HF ``Trainer.get_train_dataloader`` /
    ``get_eval_dataloader`` / ``get_test_dataloader``.

    Raises:
        TypeError: ``data`` is not a DataLoader, Dataset or sequence.
        ValueError: ``data`` is empty.
    """
    _check_data(data, what)
    if isinstance(data, DataLoader):
        return data
    collate = collate_fn or default_collate_with_labels
    if keep_columns is not None:
        collate = ColumnFilter(collate, set(keep_columns))
    kwargs: dict[str, Any] = {
        "batch_size": batch_size, "collate_fn": collate, "num_workers": args.dataloader_num_workers,
        "pin_memory": bool(args.dataloader_pin_memory) and pin_memory_supported,
        # HF drops the last short batch of evaluation and test loaders too, but never of iterable evaluation data
        "drop_last": bool(args.dataloader_drop_last) and (train or not isinstance(data, IterableDataset)),
    }
    if args.dataloader_num_workers > 0:
        kwargs["persistent_workers"] = bool(args.dataloader_persistent_workers)
        if args.dataloader_prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.dataloader_prefetch_factor
        if getattr(args, "dataloader_multiprocessing_context", None) is not None:
            kwargs["multiprocessing_context"] = args.dataloader_multiprocessing_context
    if train and not isinstance(data, IterableDataset):
        seed = args.data_seed if args.data_seed is not None else args.seed
        sampling = getattr(args, "train_sampling_strategy", "random")
        if sampling == "group_by_length" or getattr(args, "group_by_length", False):
            kwargs["sampler"] = LengthGroupedSampler(_lengths(data, args.length_column_name), batch_size, seed)
        elif sampling == "sequential":  # HF 5 train_sampling_strategy="sequential": dataset order
            kwargs["sampler"] = SequentialSampler(data)
        else:
            kwargs["sampler"] = EpochRandomSampler(len(data), seed)
    return DataLoader(data, **kwargs)


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """Tell a loader's sampler / batch sampler / iterable dataset which epoch starts (``set_epoch`` protocol); a
    ``RandomSampler`` with its own generator is set to the epoch's start
    (:func:`~taskfit.data.samplers.position_generator`: a resumed run draws the uninterrupted run's order)."""
    from taskfit.data.samplers import position_generator

    for obj in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None),
                getattr(loader, "dataset", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
        own = getattr(obj, "generator", None)
        shared = own is not None and getattr(loader, "generator", None) is own and not getattr(
            loader, "persistent_workers", False)  # a persistent iterator draws its base seed once
        position_generator(obj, epoch, loader_draws=1 if shared else 0)


def num_examples(loader: Any) -> int:
    """Samples in a DataLoader's dataset (HF ``Trainer.num_examples``)."""
    return len(loader.dataset)


def num_tokens(loader: Any, max_steps: int | None = None) -> int:
    """Tokens (``input_ids`` elements) in a loader's batches, up to ``max_steps`` batches (HF ``num_tokens``)."""
    total = 0
    for i, batch in enumerate(loader):
        if max_steps is not None and i >= max_steps:
            break
        total += batch["input_ids"].numel()
    return total


def floating_point_ops(model: torch.nn.Module, inputs: Any) -> int:
    """Training FLOPs of one batch: 6 x parameters x tokens (``input_ids`` elements) or x samples (the HF
    ``floating_point_ops`` estimate)."""
    from taskfit.core.module import infer_batch_size

    n = sum(p.numel() for p in model.parameters())
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        return 6 * n * inputs["input_ids"].numel()
    return 6 * n * infer_batch_size(inputs)


class SkipBatchSampler:
    """Yield the batches of ``batch_sampler`` after the first ``skip`` (indices only: no sample is loaded for
    the skipped batches). Mirrors Accelerate's ``SkipBatchSampler``.

    Args:
        batch_sampler (Iterable[list[int]]): the loader's batch sampler.
        skip (int): batches to drop from the start of the next iteration.
    """

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler, self.skip = batch_sampler, int(skip)

    def __iter__(self) -> Any:
        for i, batch in enumerate(self.batch_sampler):
            if i >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


def skip_first_batches(loader: Any, skip: int) -> Any:
    """An iterable over ``loader``'s current epoch that starts at batch ``skip`` (exact mid-epoch resume).

    A map-style ``DataLoader`` is rebuilt around a :class:`SkipBatchSampler` (same dataset, collate function,
    workers and sampler object, so ``set_epoch`` on the original still decides the order), so the skipped batches
    are never loaded. Other iterables (an ``IterableDataset``, a custom loader) can only be fast-forwarded by
    reading and dropping ``skip`` batches, which is logged as a warning.

    Args:
        loader (DataLoader | Iterable): the training loader.
        skip (int): micro-batches already consumed in this epoch.
    """
    if skip <= 0:
        return loader
    if isinstance(loader, DataLoader) and loader.batch_sampler is not None and not isinstance(
            loader.dataset, IterableDataset):
        kwargs: dict[str, Any] = {
            "batch_sampler": SkipBatchSampler(loader.batch_sampler, skip), "collate_fn": loader.collate_fn,
            "num_workers": loader.num_workers, "pin_memory": loader.pin_memory, "timeout": loader.timeout,
            "worker_init_fn": loader.worker_init_fn, "multiprocessing_context": loader.multiprocessing_context,
            "generator": loader.generator, "persistent_workers": False,
        }
        if loader.num_workers > 0:
            kwargs["prefetch_factor"] = loader.prefetch_factor
        return DataLoader(loader.dataset, **kwargs)
    import itertools
    import logging

    logging.getLogger("taskfit").warning(
        "Resuming mid-epoch on a %s without a batch sampler: reading and dropping %d batches to reach the saved "
        "position.", type(loader).__name__, skip)
    return itertools.islice(loader, skip, None)


def shutdown_workers(loader: Any) -> None:
    """Shut down the worker processes kept for ``loader``: a wrapper's kept iterator is released (``release()``,
    e.g. a batch-limited loader's), a persistent-workers ``DataLoader``'s iterator shut down and forgotten, through
    wrappers that hold their loader as ``.loader``; a no-op otherwise. Mirrors Lightning's data fetcher teardown
    and ``_shutdown_workers_and_reset_iterator``."""
    if callable(getattr(type(loader), "release", None)):
        loader.release()
    inner = loader.__dict__.get("loader") if hasattr(loader, "__dict__") else None
    if inner is not None and inner is not loader:
        shutdown_workers(inner)
    it = loader.__dict__.get("_iterator") if isinstance(loader, DataLoader) else None
    if isinstance(it, _MultiProcessingDataLoaderIter):
        it._shutdown_workers()
        loader._iterator = None


def _rebuild_kwargs(loader: DataLoader, sampler: Any) -> dict[str, Any]:
    """The arguments that rebuild ``loader`` (a DataLoader with a ``batch_size``) around ``sampler``."""
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size, "drop_last": loader.drop_last, "sampler": sampler,
        "collate_fn": loader.collate_fn, "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
        "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context, "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


def sequential_loader(loader: Any, prefix: str) -> Any:
    """``loader`` reading its dataset in order, for ``overfit_batches`` (the same batches every epoch): a
    ``DataLoader`` over a map-style dataset whose sampler is not a ``SequentialSampler`` is rebuilt with one, with
    Lightning's warning (``prefix``: ``"train"`` or ``"val"``); anything else is returned unchanged. Mirrors
    Lightning's ``_resolve_overfit_batches``."""
    if not isinstance(loader, DataLoader) or isinstance(loader.sampler, SequentialSampler) or \
            isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        return loader
    warnings.warn(f"You requested to overfit but enabled {prefix} dataloader shuffling. We are turning off the "
                  f"{prefix} dataloader shuffling for you.", UserWarning, stacklevel=2)
    return DataLoader(loader.dataset, **_rebuild_kwargs(loader, SequentialSampler(loader.dataset)))


def distributed_loader(loader: Any, num_replicas: int, rank: int) -> Any:
    """``loader`` rebuilt so this process reads its share of the samples (see
    :class:`~taskfit.data.samplers.DistributedSamplerWrapper`); iterable datasets are returned unchanged (they
    must shard themselves, e.g. with ``torch.utils.data.get_worker_info`` and the rank), and so is a loader whose
    sampler is a ``DistributedSampler`` already splitting for ``num_replicas`` at ``rank``. A torchdata
    ``StatefulDataLoader`` stays one (its ``state_dict`` is what a mid-epoch resume restores).

    Raises:
        ValueError: a DataLoader built with a custom ``batch_sampler`` (no per-sample order to split).
    """
    from taskfit.data.samplers import DistributedSamplerWrapper

    if num_replicas <= 1 or not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, DistributedSampler) and (loader.sampler.num_replicas, loader.sampler.rank) == (
            num_replicas, rank):  # already this process's share (Lightning's rule, or the user's own sampler)
        return loader
    if loader.batch_size is None:
        raise ValueError("A DataLoader with a custom batch_sampler cannot be split across processes automatically; "
                         "pass a Dataset (or a DataLoader with batch_size) instead.")
    return with_sampler(loader, DistributedSamplerWrapper(loader.sampler, num_replicas, rank))


def with_sampler(loader: DataLoader, sampler: Any) -> DataLoader:
    """``loader`` rebuilt with ``sampler`` and its other settings kept; a torchdata ``StatefulDataLoader`` stays one
    (its ``state_dict`` is what a mid-epoch resume restores)."""
    kwargs = _rebuild_kwargs(loader, sampler)
    stateful = sys.modules.get("torchdata.stateful_dataloader")
    if stateful is not None and type(loader) is stateful.StatefulDataLoader:  # keep its own resumable state
        return stateful.StatefulDataLoader(loader.dataset, snapshot_every_n_steps=loader.snapshot_every_n_steps,
                                           **kwargs)
    return DataLoader(loader.dataset, **kwargs)


def splits_evenly(loader: Any) -> bool:
    """Whether every process reads the same number of samples per batch from ``loader``: a map-style
    ``DataLoader`` with a fixed ``batch_size`` over a :class:`~taskfit.data.samplers.DistributedSamplerWrapper` or
    ``DistributedSampler`` (both give each process ``ceil(n / W)`` indices), so the i-th batches of all
    processes have the same size and a batch-size item count needs no all-reduce."""
    from torch.utils.data import DistributedSampler

    from taskfit.data.samplers import DistributedSamplerWrapper

    return (isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)
            and loader.batch_size is not None
            and isinstance(loader.sampler, (DistributedSamplerWrapper, DistributedSampler)))


#: HF ``accelerator_config`` keys (Accelerate's ``DataLoaderConfiguration``) taskfit understands
ACCELERATOR_CONFIG_KEYS = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
                           "gradient_accumulation_kwargs", "use_configured_state")


def data_options(args: Any) -> dict[str, Any]:
    """``split_batches`` / ``dispatch_batches`` from ``accelerator_config`` (dict or JSON file) and the deprecated
    top-level flags (mirrors HF ``AcceleratorConfig``). ``dispatch_batches`` is accepted: every process reads its
    own share, which gives the same batches as rank 0 reading and scattering them. ``even_batches`` must stay
    True (uneven splits are padded, and evaluation drops the repeats).

    Raises:
        ValueError: an unknown key, ``even_batches=False``, or text/a file that is not a JSON object.
        FileNotFoundError: a path that does not exist.
    """
    from taskfit.json_options import load_json_object

    cfg = load_json_object(args.accelerator_config, "accelerator_config")
    unknown = sorted(set(cfg) - set(ACCELERATOR_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"Unknown accelerator_config key(s) {unknown}; valid keys: {list(ACCELERATOR_CONFIG_KEYS)}.")
    if cfg.get("even_batches") is False:
        raise ValueError("accelerator_config even_batches=False is not supported: taskfit pads uneven splits (like "
                         "DistributedSampler) and drops the repeats from evaluation results.")
    split = bool(cfg.get("split_batches", False) or args.split_batches)
    return {"split_batches": split, "dispatch_batches": bool(cfg.get("dispatch_batches", False) or args.dispatch_batches)}


def per_process_batch_size(args: Any, world_size: int, train: bool) -> int:
    """The batch size one process loads: ``per_device_*_batch_size``, or with ``split_batches`` that size divided
    by ``world_size`` (the configured size is then the global batch, as in Accelerate).

    Raises:
        ValueError: ``split_batches`` with a batch size that ``world_size`` does not divide.
    """
    size = args.per_device_train_batch_size if train else args.per_device_eval_batch_size
    if world_size > 1 and data_options(args)["split_batches"]:
        if size % world_size:
            raise ValueError(f"split_batches=True splits each batch of {size} over {world_size} processes; choose a "
                             f"batch size divisible by {world_size}.")
        return size // world_size
    return size
