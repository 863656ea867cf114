"""The memory and speed techniques of the single-GPU efficiency guide (F-MEM-1..5, F-LOOP-7, F-PREC-2), applied
to a ``Fit`` run from a few call sites in ``taskfit.fit.fit`` (the logic lives here, not in ``Fit``).

Order of application: :func:`check_run` when ``Fit`` is built (TF32, option checks: before any work),
:func:`setup_techniques` once per module after the strategy placed it (gradient checkpointing, then
``torch.compile``), :func:`start_training` / :func:`end_training` around the fit loop (NEFTune hook on, then
off), :func:`prepare_full_eval` before a stand-alone validate/test/predict (``fp16_full_eval``/``bf16_full_eval``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from taskfit.callbacks.base import Callback
from taskfit.efficiency.batch_size import fit_with_auto_batch_size, is_out_of_memory
from taskfit.efficiency.checkpointing import (
    CHECKPOINT_OPTIONS, disable_gradient_checkpointing, enable_gradient_checkpointing, hf_models,
)
from taskfit.efficiency.compile import check_compile_options, compile_module
from taskfit.efficiency.neftune import activate_neftune, deactivate_neftune
from taskfit.precision import apply_tf32
from taskfit.registry import invalid_choice

if TYPE_CHECKING:
    from taskfit.protocols import FitView

log = logging.getLogger("taskfit")

__all__ = [
    "activate_neftune", "attention_implementation", "check_run", "compile_module", "deactivate_neftune",
    "disable_gradient_checkpointing", "enable_gradient_checkpointing", "end_training", "fit_with_auto_batch_size",
    "is_out_of_memory", "prepare_full_eval", "setup_techniques", "start_training", "TechniquesCallback",
]


def check_run(fit: FitView) -> dict[str, bool] | None:
    """Checks and switches at ``Fit(...)`` time, before any work (called once from ``Fit.__init__``).

    Sets the TF32 flags (:func:`taskfit.precision.apply_tf32`, logged), checks the compile backend/mode and the
    ``gradient_checkpointing_kwargs`` keys, installs :class:`~taskfit.core.wrapping.LabelSmoother` as
    ``compute_loss_func`` for ``label_smoothing_factor > 0`` (plain models; a TaskModule computes its own loss)
    and adds :class:`TechniquesCallback` when NEFTune or a full-eval precision needs switching around training.

    Returns:
        dict | None: the TF32 flags as set (None when ``tf32`` is unset).

    Raises:
        ValueError: ``tf32`` set off CUDA or on a pre-Ampere GPU; unknown compile backend or mode; an unknown
            ``gradient_checkpointing_kwargs`` key; ``label_smoothing_factor`` together with ``compute_loss_func``;
            ``tpu_metrics_debug`` off XLA.
    """
    args, strategy = fit.args, fit.strategy
    flags = apply_tf32(args.tf32, strategy.root_device, strategy.accelerator)
    if flags is not None:
        log.info("taskfit: tf32 matmul=%s cudnn=%s", flags["matmul"], flags["cudnn"])
    if args.torch_compile:
        check_compile_options(args.torch_compile_backend, args.torch_compile_mode)
    if args.gradient_checkpointing:
        for key in args.gradient_checkpointing_kwargs or {}:
            if key not in (*CHECKPOINT_OPTIONS, "layers"):
                raise invalid_choice("gradient_checkpointing_kwargs key", key, (*CHECKPOINT_OPTIONS, "layers"))
    if args.label_smoothing_factor:
        from taskfit.core.wrapping import LabelSmoother

        if fit.compute_loss_func is not None:
            raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor!r} and compute_loss_func are both "
                             "set; smooth the labels inside compute_loss_func instead.")
        fit.compute_loss_func = LabelSmoother(args.label_smoothing_factor, fit)
    if args.neftune_noise_alpha is not None or args.fp16_full_eval or args.bf16_full_eval:
        fit.callbacks.append(TechniquesCallback())
    from taskfit.callbacks.xla_metrics import XLAMetricsReport, check_xla_metrics_option

    if check_xla_metrics_option(args, strategy.accelerator.name):  # debug="tpu_metrics_debug"
        fit.callbacks.append(XLAMetricsReport())
    return flags


class TechniquesCallback(Callback):
    """Internal callback: :func:`start_training` on ``on_train_start``, :func:`end_training` on ``on_train_end``
    and ``on_exception`` (so the NEFTune hook never outlives training)."""

    def on_train_start(self, fit: FitView, module: nn.Module) -> None:
        start_training(fit, module)

    def on_train_end(self, fit: FitView, module: nn.Module) -> None:
        end_training(fit, module)

    def on_exception(self, fit: FitView, module: nn.Module, exception: BaseException) -> None:
        end_training(fit, module)


def setup_techniques(fit: FitView, module: nn.Module) -> None:
    """Once per module, after the strategy placed it: gradient checkpointing, ``debug="underflow_overflow"``
    hooks (:class:`~taskfit.efficiency.debug.DebugUnderflowOverflow`), then ``torch.compile``."""
    args = fit.args
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(module, args.gradient_checkpointing_kwargs)
    if "underflow_overflow" in args.debug:
        from taskfit.efficiency.debug import DebugUnderflowOverflow

        DebugUnderflowOverflow(module)
    if args.torch_compile:
        compile_module(module, args.torch_compile_backend, args.torch_compile_mode)


def start_training(fit: FitView, module: nn.Module) -> None:
    """Before the fit loop: undo a previous full-eval cast, switch NEFTune on (``neftune_noise_alpha``)."""
    fit.strategy.use_eval_precision(module, None)  # undo a previous full-eval cast
    if fit.args.neftune_noise_alpha is not None:
        fit._neftune_embedding = activate_neftune(module, fit.args.neftune_noise_alpha)


def end_training(fit: FitView, module: nn.Module) -> None:
    """After the fit loop (also on errors): remove the NEFTune hook, leaving the embedding layer as before."""
    deactivate_neftune(getattr(fit, "_neftune_embedding", None))
    fit._neftune_embedding = None


def prepare_full_eval(fit: FitView, module: nn.Module) -> None:
    """``fp16_full_eval`` / ``bf16_full_eval``: a stand-alone validate/test/predict runs in ``16-true`` /
    ``bf16-true`` (module and inputs cast), as HF casts the model for evaluation outside training. The module
    stays cast until the next ``fit``, which casts it back to its training precision (values rounded to 16 bits,
    as in HF)."""
    args = fit.args
    dtype = torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None
    if dtype is not None:
        fit.strategy.use_eval_precision(module, dtype)


def attention_implementation(module: nn.Module) -> dict[str, str]:
    """``{name: implementation}`` of the HF models in ``module`` (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``).

    F-MEM-3: Hugging Face models pick ``torch.nn.functional.scaled_dot_product_attention`` (``"sdpa"``) by default
    when the model class supports it; load with ``attn_implementation="sdpa"`` to insist on it (an error if the
    class does not support it) or ``"flash_attention_2"`` where the flash-attn package is installed.
    """
    names = {id(m): n for n, m in module.named_modules()}
    out = {}
    for m in hf_models(module):
        impl = getattr(getattr(m, "config", None), "_attn_implementation", None)
        if impl is not None:
            out[names.get(id(m), "")] = impl
    return out
