"""``auto_find_batch_size`` (F-LOOP-7): on out-of-memory, free memory, halve the batch and retry.

Mirrors HF ``TrainingArguments.auto_find_batch_size`` (Accelerate's ``find_executable_batch_size``), with one
difference: the model's weights are restored to what they were before the failed attempt, so the run that
succeeds is the same as one started with that batch size.
"""

from __future__ import annotations

import gc
import inspect
import logging
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from taskfit.fit import Fit

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


def fit_with_auto_batch_size(fit: Fit, **kwargs: Any) -> Any:
    """Run ``fit.fit(**kwargs)``; on out-of-memory halve ``per_device_train_batch_size`` and retry.

    ``kwargs`` are ``Fit.fit``'s arguments by name (``model``, ``train_data``, ...); other names are ignored.

    Before each retry: memory is released, the model's state dict is restored from a CPU copy taken before the
    first attempt (when ``model`` is given; with ``model_init`` a fresh model is built anyway) and a warning is
    logged (``auto_find_batch_size: out of memory at per_device_train_batch_size=8; retrying with 4``). The batch
    size that worked is in ``fit.args.per_device_train_batch_size`` and ``fit.state.train_batch_size`` afterwards.

    Returns:
        TrainOutput: the result of the attempt that fitted.

    Raises:
        ValueError: out of memory with a ``DataLoader`` as ``train_data`` (its batch size is fixed; pass the
            dataset instead).
        torch.OutOfMemoryError / RuntimeError: out of memory at batch size 1, or any error that is not an
            out-of-memory one (re-raised as is).
    """
    accepted = inspect.signature(type(fit).fit).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted and k != "self"}  # fit's locals() may hold more
    model, train_data = kwargs.get("model"), kwargs.get("train_data")
    snapshot = None
    if isinstance(model, torch.nn.Module):
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    fit._auto_batch_size_active = True
    try:
        while True:
            size = fit.args.per_device_train_batch_size
            try:
                return fit.fit(**kwargs)
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                if not is_out_of_memory(exc) or size <= 1:
                    raise
                if isinstance(train_data, torch.utils.data.DataLoader):
                    raise ValueError("auto_find_batch_size=True ran out of memory, but train_data is a DataLoader "
                                     f"with a fixed batch size ({train_data.batch_size}); pass the dataset so "
                                     "taskfit can build smaller batches.") from exc
            # outside the except block: the traceback (and the tensors its frames hold) is gone
            release_memory(fit.strategy.accelerator)
            log.warning("auto_find_batch_size: out of memory at per_device_train_batch_size=%d; retrying with %d",
                        size, size // 2)
            fit.args = fit.args.replace(per_device_train_batch_size=size // 2)
            if snapshot is not None:
                model.load_state_dict(snapshot)
            elif fit.model_init is not None:  # build a fresh model on the next attempt
                fit.model = fit.module = fit._setup_done_for = None
    finally:
        fit._auto_batch_size_active = False
