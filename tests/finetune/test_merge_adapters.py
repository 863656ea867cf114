"""``save_model(merge_adapters=True)`` of a LoRA model: full weights of a merged copy that load into the base
architecture (transformers' ``from_pretrained``, no PEFT) and give the adapter model's outputs; the live model
keeps its adapters and its weights."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("peft")

from finetune_common import equal_rows, lora_model, tiny_llama, weights  # noqa: E402

from taskfit.hf import Trainer, TrainingArguments  # noqa: E402


def test_save_model_merge_adapters_loads_into_the_base_F_FT_1(tmp_path):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    model = lora_model()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2,
                             learning_rate=5e-2, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=equal_rows(8))
    trainer.train()
    before = weights(model)
    trainer.save_model(str(tmp_path / "merged"), merge_adapters=True)
    trainer.save_model(str(tmp_path / "adapter"))

    assert isinstance(model, PeftModel) and any("lora_A" in k for k in weights(model))
    assert all(torch.equal(before[k], v) for k, v in weights(model).items())  # the live model is untouched
    files = set(os.listdir(tmp_path / "merged"))
    assert {"model.safetensors", "config.json"} <= files and "adapter_config.json" not in files
    merged = LlamaForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert not any("lora" in k for k in merged.state_dict())
    ids = torch.tensor([equal_rows(8)[0]["input_ids"]])
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).logits
        from_adapter = PeftModel.from_pretrained(tiny_llama(), str(tmp_path / "adapter")).eval()(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5) and torch.equal(from_adapter, expected)
    assert not torch.allclose(tiny_llama().eval()(input_ids=ids).logits, expected, atol=1e-3)  # the adapter mattered


def test_merge_adapters_without_peft_model_is_refused_F_FT_1(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=equal_rows(4))
    with pytest.raises(ValueError, match="merge_adapters=True.*peft.PeftModel.*LlamaForCausalLM"):
        trainer.save_model(str(tmp_path / "m"), merge_adapters=True)
    assert not os.path.exists(tmp_path / "m")
