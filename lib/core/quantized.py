"""Training a quantised model (a bitsandbytes 4-bit or 8-bit base loaded by transformers): what may train.

Mirrors ``transformers.trainer_utils.validate_quantization_for_training``, which ``transformers.Trainer`` runs on its
model: a quantised base model trains only with adapters attached (PEFT, e.g. QLoRA: ``prepare_model_for_kbit_training``
then ``get_peft_model``), unless its quantisation method supports training the quantised weights themselves (QAT);
a quantised model under ``torch.compile`` is refused. The bitsandbytes CPU backend runs 4-bit (nf4/fp4) and 8-bit
layers forward and backward, so QLoRA trains on the CPU as on CUDA.
"""

from __future__ import annotations

from typing import Any

import torch


def check_quantized_training(model: Any) -> None:
    """Refuse to train a quantised model in the cases transformers' ``Trainer`` refuses (module docstring).

    Args:
        model (nn.Module): the model about to train (a ``peft.PeftModel`` or a transformers model; any other
            module passes).

    Raises:
        ValueError: a quantised model without adapters (full fine-tuning of quantised weights), a compiled
            quantised model, or a quantisation method that does not support training (naming it).
    """
    from taskfit.io.peft_files import is_peft_model

    if not getattr(model, "is_quantized", False) or getattr(model, "_hf_peft_config_loaded", False):
        return
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "unknown")
    method = getattr(method, "value", method)
    if hasattr(model, "_orig_mod"):
        raise ValueError("Cannot fine-tune a quantized model under torch.compile(): pass the model before compiling "
                         "it, with adapters attached (peft.get_peft_model).")
    if not is_peft_model(model) and not getattr(quantizer, "is_qat_trainable", False):
        raise ValueError(f"Cannot fine-tune a purely quantized model ({type(model).__name__}, quantized with "
                         f"{method}): its weights cannot train. Attach trainable adapters first (QLoRA: "
                         "peft.prepare_model_for_kbit_training, then peft.get_peft_model with a LoraConfig).")
    if quantizer is None or not getattr(quantizer, "is_trainable", False):
        raise ValueError(f"The model is quantized with {method}, a method that does not support training; "
                         "bitsandbytes 4-bit and 8-bit bases do (with adapters).")


#: strategies a bitsandbytes-quantised base trains under as it is: each process holds the whole model
QUANTIZED_STRATEGIES = ("single_device", "ddp")
#: strategies that shard a 4-bit base stored in a float dtype (``bnb_4bit_quant_storage``); DeepSpeed ZeRO-0/1/2
#: also train an integer-stored base, whole on every rank
SHARDING_QUANTIZED_STRATEGIES = ("fsdp", "deepspeed")
#: the dtype FSDP and DeepSpeed give floating parameters under each precision family: mixed precisions cast them
#: too (FSDP2's ``MixedPrecisionPolicy.param_dtype``, DeepSpeed's bf16/fp16 engine)
_SHARDED_PARAM_DTYPES = {"32": torch.float32, "64": torch.float64, "bf16": torch.bfloat16, "16": torch.float16}


def _storage_dtypes(model: Any) -> set[torch.dtype]:
    """The dtypes bitsandbytes stores ``model``'s quantized weights in (``Params4bit``: ``bnb_4bit_quant_storage``,
    ``uint8`` by default; ``Int8Params``: ``int8``)."""
    return {p.dtype for p in model.parameters() if type(p).__name__ in ("Params4bit", "Int8Params")}


def check_quantized_strategy(model: Any, strategy: str, detail: str = "", zero_stage: int | None = None,
                             precision: str = "32-true") -> None:
    """Refuse a bitsandbytes-quantised base (QLoRA, 8-bit) under a strategy that would corrupt its frozen weights,
    before any process starts or any weight moves.

    bitsandbytes keeps 4-bit weights as ``Params4bit`` packed two per byte in ``bnb_4bit_quant_storage`` (``uint8``
    by default) with their quantisation state on the parameter and its module, and 8-bit weights as ``int8``
    ``Int8Params``. One process, ``"ddp"`` and DeepSpeed ZeRO-0/1/2 keep every parameter whole on every rank:
    ZeRO-1/2 flatten and partition only what trains (the adapters' gradients and optimizer state), and
    ``deepspeed.initialize`` casts only floating parameters. FSDP's ``fully_shard`` and ZeRO-3 partition every
    parameter: a 4-bit weight stored in a float dtype shards as any tensor (accelerate's FSDP-QLoRA recipe,
    ``bnb_4bit_quant_storage=torch.bfloat16``; bitsandbytes' ``Linear4bit`` restores the quantisation state on the
    plain weight FSDP gathers, ZeRO-3 keeps the ``Params4bit`` object), an integer one does not (accelerate leaves
    uint8 weights out of FSDP2's sharding; taskfit refuses them). FSDP and DeepSpeed cast floating parameters to
    the run's precision (a mixed precision too), which would cast the packed bytes: the storage dtype must be that
    precision's. Other strategies (``"dp"``, ``"model_parallel"``, XLA) refuse a bitsandbytes base.

    Args:
        model (nn.Module): the model about to train (any module passes unless it is quantised by bitsandbytes).
        strategy (str): the strategy's name (``"fsdp"``, ``"deepspeed"``...).
        detail (str): shown after the name (e.g. ``" (ZeRO-3)"``).
        zero_stage (int | None): the DeepSpeed ZeRO stage (0-3) when ``strategy`` is ``"deepspeed"``.
        precision (str): the run's precision name (``"32-true"``, ``"bf16-mixed"``...).

    Raises:
        ValueError: under ``"fsdp"`` or ZeRO-3, 8-bit weights or 4-bit weights stored in ``uint8`` (naming
            ``bnb_4bit_quant_storage`` and the strategies that work); under FSDP or DeepSpeed, 4-bit weights stored
            in a float dtype other than the precision's (naming both); any bitsandbytes base under another
            strategy.
    """
    if strategy in QUANTIZED_STRATEGIES or not getattr(model, "is_quantized", False):
        return
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "unknown")
    if getattr(method, "value", method) != "bitsandbytes":
        return
    stored = _storage_dtypes(model)
    floating = {d for d in stored if d.is_floating_point} if strategy in SHARDING_QUANTIZED_STRATEGIES else set()
    wanted = _SHARDED_PARAM_DTYPES.get(precision.split("-")[0], "another dtype")
    if floating and floating != {wanted}:
        raise ValueError(f"strategy={strategy!r}{detail} with precision={precision!r} needs the packed 4-bit weights "
                         f"of {type(model).__name__} stored in {wanted}, the dtype it keeps or casts floating "
                         f"parameters in (another would be cast value by value); they are stored as "
                         f"{sorted(map(str, floating))}. Load the base with BitsAndBytesConfig(load_in_4bit=True, "
                         f"bnb_4bit_quant_storage={wanted}).")
    if (strategy == "deepspeed" and zero_stage is not None and zero_stage <= 2) or (stored and stored == floating):
        return
    why = ("it shards or flattens the parameters, and bitsandbytes' 4-bit/8-bit weights keep their quantization "
           "state outside the tensor")
    if strategy in SHARDING_QUANTIZED_STRATEGIES:
        why = (f"its weights are stored as {sorted(map(str, stored - floating))}, and it shards every parameter into "
               "plain tensors: bitsandbytes recovers the quantization state only of 4-bit weights stored in a float "
               "dtype. Load the 4-bit base with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage="
               "torch.float32) (torch.bfloat16 for a bf16 precision) to shard it")
    raise ValueError(f"strategy={strategy!r}{detail} cannot train a base quantized with bitsandbytes "
                     f"({type(model).__name__}): {why}. Or keep the quantized base whole on every process with "
                     "strategy='ddp' or 'deepspeed_stage_2' (ZeRO-2 shards the adapters' optimizer state and "
                     "gradients), or train on one process.")


def check_quantized_setup(model: Any, strategy: Any, training: bool = True) -> None:
    """The quantised-model checks every door runs on its model before the strategy wraps it (``Fit`` and
    ``taskfit.hf.Trainer`` before any worker starts, ``Engine.setup`` before any weight moves): the strategy check
    (:func:`check_quantized_strategy`) and, when the model is about to train, the training check
    (:func:`check_quantized_training`).

    Args:
        model (nn.Module): the model (a ``peft.PeftModel``, a transformers model, or any module: it passes).
        strategy (Strategy): the run's strategy (its ``name``, and ``zero_stage`` for DeepSpeed).
        training (bool): the model will train (``Engine.setup`` with optimizers); False checks the strategy only.

    Raises:
        ValueError: as :func:`check_quantized_strategy` and :func:`check_quantized_training` raise.
    """
    stage = getattr(strategy, "zero_stage", None)
    precision = getattr(getattr(strategy, "precision", None), "name", "32-true")
    policy = getattr(strategy, "mixed_precision", None)  # FSDP's own MixedPrecisionPolicy overrides the plugin's
    if getattr(policy, "param_dtype", None) is not None:
        precision = {v: k for k, v in _SHARDED_PARAM_DTYPES.items()}.get(policy.param_dtype, precision)
    check_quantized_strategy(model, strategy.name, f" (ZeRO-{stage})" if stage is not None else "", stage,
                             str(precision))
    if training:
        check_quantized_training(model)
