"""Run by tests/finetune/test_lora_sharded.py: LoRA fine-tuning of the tiny Llama under ``taskfit.hf.Trainer`` with
the strategy named by the second argument (``ddp``, ``fsdp``, ``deepspeed_stage_2``, ``deepspeed_stage_3``) on 2
gloo processes (taskfit re-launches this script per rank), 2 rows per process, 4 steps, a checkpoint every 2; with a
third argument, resumed from that checkpoint. ``save_model`` then writes the (gathered) adapter to ``{out}/final``.
With ``qlora`` as fourth argument the base is the nf4 model saved in ``{out}/../base``."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import equal_rows, lora_model  # noqa: E402

import taskfit.hf as m  # noqa: E402

#: a base big enough that its weights (~1.2 MB) dwarf the adapter and its optimizer state (~30 KB) in a checkpoint
SIZES = {"hidden_size": 128, "intermediate_size": 256}


def main(out: str, strategy: str, resume: str = "", base: str = "") -> None:
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=4, save_steps=2,
                               learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                               disable_tqdm=True, ddp_backend="gloo", ddp_timeout=300)
    model = lora_model(sizes=SIZES) if not base else qlora_model(base)
    trainer = m.Trainer(model=model, args=args, train_dataset=equal_rows(16), strategy=strategy, devices=2)
    trainer.train(resume_from_checkpoint=resume or None)
    trainer.save_model(os.path.join(out, "final"))


def qlora_model(base: str) -> Any:
    """The nf4 base saved in folder ``base`` (fp32 compute), prepared for k-bit training, with the LoRA adapters
    of :func:`finetune_common.lora_model` (the same seed)."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    model = LlamaForCausalLM.from_pretrained(base, quantization_config=config, device_map="cpu")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


if __name__ == "__main__":
    main(*sys.argv[1:])
