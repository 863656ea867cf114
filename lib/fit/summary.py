"""The one-screen summary at the start of ``fit`` (F-OBS-4): where and how the run trains, how big the model
is, how many samples make one optimizer step."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning_utilities.core.rank_zero import rank_zero_only

if TYPE_CHECKING:
    from taskfit.protocols import FitView

log = logging.getLogger("taskfit")


def loader_batch_size(loader: Any) -> int | None:
    """The micro-batch size ``loader`` yields: its ``batch_size``, else its ``batch_sampler``'s (a loader built
    with a custom batch sampler), else None (unknown: an iterable that batches itself)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def run_summary(fit: FitView, module: Any, max_steps: int, steps_per_epoch: int | None,
                train_loader: Any = None) -> dict[str, Any]:
    """The facts of a run before its first step; the batch sizes are those of ``train_loader`` (the loader the
    run trains on: a DataModule's or the module's own loader may batch differently from
    ``per_device_train_batch_size``), else of the arguments.

    Returns:
        dict: ``accelerator`` (class name), ``device`` (e.g. ``"cpu"``, ``"cuda:0"``), ``accelerator_reason``
        (why it was chosen, F-ACC-1), ``visible_devices`` (CUDA only: ``CUDA_VISIBLE_DEVICES`` and
        ``CUDA_DEVICE_ORDER``, None when unset), ``strategy``,
        ``precision`` (plugin name), ``world_size`` (processes), ``num_nodes``, ``parameters`` and
        ``trainable_parameters`` (counts), ``per_device_batch_size``, ``gradient_accumulation_steps``,
        ``effective_batch_size`` (samples per optimizer step over all processes), ``max_steps``,
        ``steps_per_epoch`` (None for data without a length), and ``memory_estimate`` (bytes per device:
        parameters, gradients and optimizer state from :func:`taskfit.efficiency.estimate.estimate_memory`,
        F-MEM-5; activations are not included; absent when it cannot be estimated).
    """
    a, s = fit.args, fit.strategy
    params = list(module.parameters())
    per_device = loader_batch_size(train_loader) or a.per_device_train_batch_size
    out: dict[str, Any] = {
        "accelerator": type(s.accelerator).__name__, "device": str(s.root_device), "strategy": s.name,
        "precision": s.precision.name, "world_size": s.world_size, "num_nodes": getattr(a, "num_nodes", 1),
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "per_device_batch_size": per_device,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "data_parallel_size": getattr(s, "data_parallel_size", s.world_size),  # tensor-parallel ranks share samples
        "effective_batch_size": per_device * a.gradient_accumulation_steps
        * getattr(s, "data_parallel_size", s.world_size),
        "max_steps": max_steps, "steps_per_epoch": steps_per_epoch,
        "accelerator_reason": getattr(s.accelerator, "selection_reason", None),
    }
    if hasattr(s.accelerator, "visible_devices"):  # CUDA: CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER (F-ACC-2)
        out["visible_devices"] = s.accelerator.visible_devices()
    try:  # F-MEM-5: parameters + gradients + optimizer state per device (activations need a batch: left out)
        from taskfit.efficiency.estimate import estimate_memory

        out["memory_estimate"] = estimate_memory(module, a, world_size=s.world_size).total
    except Exception as err:  # the summary must never stop a run
        log.debug("No memory estimate for the summary: %s", err)
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as aligned ``name: value`` lines under a header (counts with thousands separators)."""
    s = summary
    lines = [
        ("accelerator", f"{s['accelerator']} ({s['device']})"
                        + (f", {s['accelerator_reason']}" if s.get("accelerator_reason") else "")
                        + "".join(f", {k}={v}" for k, v in (s.get("visible_devices") or {}).items() if v is not None)),
        ("strategy", f"{s['strategy']}, {s['world_size']} process(es) on {s['num_nodes']} node(s)"),
        ("precision", s["precision"]),
        ("parameters", f"{s['parameters']:,} ({s['trainable_parameters']:,} trainable)"),
        ("batch", f"{s['per_device_batch_size']} per device x {s['gradient_accumulation_steps']} accumulation x "
                  f"{s['world_size']} process(es)"
                  + (f" ({s['data_parallel_size']} data-parallel)" if s.get("data_parallel_size", s["world_size"]) != s["world_size"] else "")
                  + f" = {s['effective_batch_size']} samples per optimizer step"),
        ("steps", f"{s['max_steps']} ({s['steps_per_epoch']} per epoch)"),
    ]
    if "memory_estimate" in s:
        lines.append(("memory estimate", f"{s['memory_estimate'] / 2**20:.2f} MiB per device (weights, gradients, "
                                         "optimizer state; activations not included)"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(["taskfit run summary"] + [f"  {k:<{width}} : {v}" for k, v in lines])


@rank_zero_only
def log_summary(fit: FitView, module: Any, max_steps: int, steps_per_epoch: int | None,
                train_loader: Any = None) -> None:
    """Log :func:`format_summary` of :func:`run_summary` at INFO on the ``taskfit`` logger (rank zero only)
    and keep the dict as ``fit.summary``."""
    fit.summary = run_summary(fit, module, max_steps, steps_per_epoch, train_loader)
    log.info(format_summary(fit.summary))
    hf_log = logging.getLogger("transformers.trainer")
    if hf_log.isEnabledFor(logging.INFO):  # scripts and tests written for HF read this block there
        hf_log.info(format_hf_block(fit, fit.summary))


def format_hf_block(fit: FitView, s: dict[str, Any]) -> str:
    """HF ``Trainer``'s "***** Running training *****" block (examples, epochs, batch sizes, accumulation,
    optimization steps, trainable parameters), logged at INFO on the ``transformers.trainer`` logger, where
    HF's ``log_level`` applies (mirrors ``Trainer._inner_training_loop``'s start message)."""
    run = getattr(fit, "_run", None)
    dataset = getattr(getattr(run, "train_loader", None), "dataset", None)
    try:
        examples: Any = f"{len(dataset):,}"
    except TypeError:
        examples = "unknown (no length)"
    a, steps, per_epoch = fit.args, s["max_steps"], s["steps_per_epoch"]
    epochs = -(-steps // per_epoch) if per_epoch else a.num_train_epochs
    return "\n".join([
        "***** Running training *****", f"  Num examples = {examples}", f"  Num Epochs = {epochs:,}",
        f"  Instantaneous batch size per device = {s['per_device_batch_size']:,}",
        f"  Total train batch size (w. parallel, distributed & accumulation) = {s['effective_batch_size']:,}",
        f"  Gradient Accumulation steps = {s['gradient_accumulation_steps']}",
        f"  Total optimization steps = {steps:,}",
        f"  Number of trainable parameters = {s['trainable_parameters']:,}"])
