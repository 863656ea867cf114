"""``auto_find_batch_size`` (F-LOOP-7): on out-of-memory, free memory, halve the batch and retry.

Mirrors HF ``TrainingArguments.auto_find_batch_size`` (Accelerate's ``find_executable_batch_size``), with one
difference: the model's weights are restored to what they were before the failed attempt, so the run that
succeeds is the same as one started with that batch size.
"""

from __future__ import annotations

import gc
import logging
from typing import Any, Callable

import torch

log = logging.getLogger("taskfit")

#: messages of out-of-memory errors from the CUDA, CPU, XPU, NPU and MPS allocators and cuDNN (as HF's list)
OOM_MESSAGES = ("out of memory", "can't allocate memory", "CUDNN_STATUS_NOT_SUPPORTED", "DefaultCPUAllocator",
                "MPS backend out of memory", "XPU out of memory", "NPU out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for ``torch.OutOfMemoryError`` and RuntimeErrors whose message is an allocator's out-of-memory one."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and len(exc.args) == 1 and any(
        m in str(exc.args[0]) for m in OOM_MESSAGES)


def release_memory(accelerator: Any = None) -> None:
    """Collect garbage and empty the accelerator's allocator cache (:meth:`Accelerator.empty_cache`) after an
    out-of-memory error.

    Args:
        accelerator (Accelerator | None): the run's accelerator; None: garbage collection only.
    """
    gc.collect()
    if accelerator is not None:
        accelerator.empty_cache()


def fit_with_auto_batch_size(fit_once: Callable[[Any], Any], args: Any, model: Any = None,
                             train_data: Any = None, accelerator: Any = None) -> Any:
    """Run ``fit_once(args)`` (one training run with these arguments); on out-of-memory halve
    ``per_device_train_batch_size`` and retry.

    Before each retry: memory is released, the model's state dict is restored from a CPU copy taken before the
    first attempt (when ``model`` is given; with ``model_init`` every attempt builds a fresh model anyway) and a
    warning is logged (``auto_find_batch_size: out of memory at per_device_train_batch_size=8; retrying with 4``).
    Every attempt is a new run (fresh optimizers, strategy set up again from the attempt's arguments); the batch size
    that worked is in ``fit.args.per_device_train_batch_size`` and ``fit.state.train_batch_size`` afterwards.

    Args:
        fit_once (Callable[[FitArguments], TrainOutput]): one run with the given arguments.
        args (FitArguments): the arguments of the first attempt.
        model (nn.Module | None): the model passed to ``fit`` (restored between attempts).
        train_data (Any): the training data passed to ``fit`` (a DataLoader cannot be re-batched).
        accelerator (Accelerator | None): whose allocator cache is emptied before a retry.

    Returns:
        TrainOutput: the result of the attempt that fitted.

    Raises:
        ValueError: out of memory with a ``DataLoader`` as ``train_data`` (its batch size is fixed; pass the
            dataset instead).
        torch.OutOfMemoryError / RuntimeError: out of memory at batch size 1, or any error that is not an
            out-of-memory one (re-raised as is).
    """
    snapshot = None
    if isinstance(model, torch.nn.Module):
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    while True:
        size = args.per_device_train_batch_size
        try:
            return fit_once(args)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            if not is_out_of_memory(exc) or size <= 1:
                raise
            if isinstance(train_data, torch.utils.data.DataLoader):
                raise ValueError("auto_find_batch_size=True ran out of memory, but train_data is a DataLoader "
                                 f"with a fixed batch size ({train_data.batch_size}); pass the dataset so "
                                 "taskfit can build smaller batches.") from exc
        # outside the except block: the traceback (and the tensors its frames hold) is gone
        release_memory(accelerator)
        log.warning("auto_find_batch_size: out of memory at per_device_train_batch_size=%d; retrying with %d",
                    size, size // 2)
        args = args.replace(per_device_train_batch_size=size // 2)
        if snapshot is not None:
            model.load_state_dict(snapshot)
