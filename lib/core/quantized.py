"""Training a quantised model (a bitsandbytes 4-bit or 8-bit base loaded by transformers): what may train.

Mirrors ``transformers.trainer_utils.validate_quantization_for_training``, which ``transformers.Trainer`` runs on its
model: a quantised base model trains only with adapters attached (PEFT, e.g. QLoRA: ``prepare_model_for_kbit_training``
then ``get_peft_model``), unless its quantisation method supports training the quantised weights themselves (QAT);
a quantised model under ``torch.compile`` is refused. The bitsandbytes CPU backend runs 4-bit (nf4/fp4) and 8-bit
layers forward and backward, so QLoRA trains on the CPU as on CUDA.
"""

from __future__ import annotations

from typing import Any


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


#: strategies a bitsandbytes-quantised base trains under: each process holds the whole model
QUANTIZED_STRATEGIES = ("single_device", "ddp")


def check_quantized_strategy(model: Any, strategy: str, detail: str = "", zero_stage: int | None = None) -> None:
    """Refuse a bitsandbytes-quantised base (QLoRA, 8-bit) under a strategy that shards or flattens its frozen
    weights, before any process starts or any weight moves.

    bitsandbytes keeps 4-bit weights as ``uint8`` ``Params4bit`` with their quantisation state beside the tensor,
    and 8-bit weights as ``int8`` ``Int8Params``. One process, ``"ddp"`` and DeepSpeed ZeRO-0/1/2 keep every
    parameter whole on every rank: ZeRO-1/2 flatten and partition only what trains (the adapters' gradients and
    optimizer state), and ``deepspeed.initialize`` leaves frozen integer weights as they are (it casts only float
    parameters, and its start-up broadcast from rank 0 copies their bytes in place). FSDP's ``fully_shard`` turns
    every parameter into a DTensor and ZeRO-3 partitions every parameter, and neither keeps that state.
    accelerate (under ``transformers.Trainer``) leaves such weights out of FSDP2's sharding, unsharded on every
    rank, unless ``bnb_4bit_quant_storage`` stores them in a float dtype; taskfit does not shard them either.

    Args:
        model (nn.Module): the model about to train (any module passes unless it is quantised by bitsandbytes).
        strategy (str): the strategy's name (``"fsdp"``, ``"deepspeed"``...).
        detail (str): shown after the name (e.g. ``" (ZeRO-3)"``).
        zero_stage (int | None): the DeepSpeed ZeRO stage (0-3) when ``strategy`` is ``"deepspeed"``.

    Raises:
        ValueError: a bitsandbytes-quantised model under any strategy but one process, ``"ddp"`` or DeepSpeed
            ZeRO-0/1/2, naming the strategy and what works.
    """
    if strategy in QUANTIZED_STRATEGIES or not getattr(model, "is_quantized", False):
        return
    if strategy == "deepspeed" and zero_stage is not None and zero_stage <= 2:
        return
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "unknown")
    method = getattr(method, "value", method)
    if method != "bitsandbytes":
        return
    raise ValueError(f"strategy={strategy!r}{detail} cannot train a base quantized with bitsandbytes "
                     f"({type(model).__name__}): it shards every parameter, and bitsandbytes' 4-bit/8-bit "
                     "weights keep their quantization state outside the tensor. Train the quantized base (QLoRA) "
                     "with strategy='ddp' or 'deepspeed_stage_2' (each process holds the whole quantized base, "
                     "small by design; ZeRO-2 shards the adapters' optimizer state and gradients) or on one "
                     "process; or load the base unquantized to shard it with FSDP or DeepSpeed ZeRO-3.")


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
    check_quantized_strategy(model, strategy.name, f" (ZeRO-{stage})" if stage is not None else "", stage)
    if training:
        check_quantized_training(model)
