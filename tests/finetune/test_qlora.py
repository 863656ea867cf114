"""QLoRA on the CPU: a tiny Llama loaded with a bitsandbytes nf4 base (transformers' ``BitsAndBytesConfig``), prepared
with ``peft.prepare_model_for_kbit_training`` and given LoRA adapters, trains under ``taskfit.hf.Trainer`` exactly as
under ``transformers.Trainer`` (the peer as oracle: log history and adapters bitwise, fp32 compute); full
fine-tuning of the quantized model is refused as transformers refuses it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from finetune_common import adapter_weights, both, equal_rows, stable  # noqa: E402


def nf4_llama(path: str) -> Any:
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    return LlamaForCausalLM.from_pretrained(path, quantization_config=config, device_map="cpu")


def _train(m: Any, out: str, model: Any, **kw: Any) -> Any:
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=3, logging_steps=1,
                               learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True, **kw)
    trainer = m.Trainer(model=model, args=args, train_dataset=equal_rows(16))
    trainer.train()
    return trainer


def test_qlora_nf4_base_same_as_transformers_F_FT_2(tmp_path, base_dir):
    """The base's attention and MLP layers are bitsandbytes ``Linear4bit``; with gradient checkpointing (prepared
    by ``prepare_model_for_kbit_training``: inputs require grads), 3 steps under both trainers give the same log
    history and the same adapter weights, bit for bit."""
    from bitsandbytes.nn import Linear4bit
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    def run(m: Any, out: str) -> tuple[list, dict]:
        model = prepare_model_for_kbit_training(nf4_llama(base_dir), use_gradient_checkpointing=True)
        assert isinstance(model.model.layers[0].mlp.up_proj, Linear4bit)
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
        log = stable(_train(m, out, model, gradient_checkpointing=True).state.log_history)
        assert model.get_base_model().model.gradient_checkpointing
        return log, adapter_weights(model)

    (hf_log, hf_w), (tf_log, tf_w) = both(run, tmp_path)
    assert tf_log == hf_log and len([r for r in tf_log if "loss" in r]) == 3
    assert set(tf_w) == set(hf_w) and all(torch.equal(tf_w[k], hf_w[k]) for k in hf_w)


def test_full_fine_tuning_of_quantized_model_is_refused_F_FT_2(tmp_path, base_dir):
    """Without adapters, training a 4-bit model raises before any step, as under transformers (which refuses at
    construction); the message names the model, the method and what to do."""
    import transformers

    import taskfit.hf

    with pytest.raises(ValueError, match="purely quantized"):
        _train(transformers, str(tmp_path / "hf"), nf4_llama(base_dir))
    model = nf4_llama(base_dir)
    with pytest.raises(ValueError, match="purely quantized model \\(LlamaForCausalLM, quantized with bitsandbytes"
                                         ".*get_peft_model"):
        _train(taskfit.hf, str(tmp_path / "tf"), model)


def test_8bit_base_with_lora_same_as_transformers_F_FT_2(tmp_path, base_dir):
    """bitsandbytes 0.50.2 runs int8 layers (``Linear8bitLt``, ``load_in_8bit``) forward and backward on the CPU
    (inputs cast to fp16 for the int8 matmul): a LoRA run on an 8-bit base gives under both trainers the same log
    history and adapter weights, bit for bit, and the loss moves."""
    from bitsandbytes.nn import Linear8bitLt
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    def run(m: Any, out: str) -> tuple[list, dict]:
        model = LlamaForCausalLM.from_pretrained(base_dir, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                                 device_map="cpu")
        assert isinstance(model.model.layers[0].mlp.up_proj, Linear8bitLt)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
        return stable(_train(m, out, model).state.log_history), adapter_weights(model)

    (hf_log, hf_w), (tf_log, tf_w) = both(run, tmp_path)
    losses = [r["loss"] for r in tf_log if "loss" in r]
    assert tf_log == hf_log and len(losses) == 3 and losses[0] != losses[-1]
    assert set(tf_w) == set(hf_w) and all(torch.equal(tf_w[k], hf_w[k]) for k in hf_w)
