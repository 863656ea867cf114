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
