"""Run by tests/finetune/test_qlora_sharded.py: QLoRA fine-tuning of the tiny Llama saved in folder ``base`` under
``taskfit.hf.Trainer`` with the strategy named by the second argument on 2 gloo processes (taskfit re-launches this
script per rank), 2 rows per process, 4 steps, a checkpoint every 2; with a third argument, resumed from that
checkpoint. The fifth argument names the quantized base (:data:`BASES`). Each rank then writes how many elements of
the frozen parameters it holds to ``{out}/frozen_rank{r}.json`` and ``save_model`` writes the adapter to
``{out}/final``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import equal_rows  # noqa: E402

import taskfit.hf as m  # noqa: E402

#: the quantized bases: nf4 stored as bitsandbytes' default uint8, nf4 stored in float32 or bfloat16 (accelerate's
#: FSDP-QLoRA recipe; the bf16 one trains with ``bf16=True``) and LLM.int8()
BASES = ("nf4", "nf4-fp32", "nf4-bf16", "int8")


def main(out: str, strategy: str, resume: str, base: str, kind: str) -> None:
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=4, save_steps=2,
                               learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                               disable_tqdm=True, ddp_backend="gloo", ddp_timeout=300, bf16=kind == "nf4-bf16")
    trainer = m.Trainer(model=quantized_lora_model(base, kind), args=args, train_dataset=equal_rows(16),
                        strategy=strategy, devices=2)
    trainer.train(resume_from_checkpoint=resume or None)
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    with open(os.path.join(out, f"frozen_rank{trainer.args.process_index}.json"), "w") as fh:
        json.dump({"local": sum(local_numel(p) for p in frozen), "full": sum(full_numel(p) for p in frozen)}, fh)
    trainer.save_model(os.path.join(out, "final"))


def local_numel(p: Any) -> int:
    """The elements of ``p`` this rank holds: its FSDP2 shard (DTensor), its ZeRO-3 partition, or all."""
    if hasattr(p, "to_local"):
        return p.to_local().numel()
    return p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()


def full_numel(p: Any) -> int:
    return p.ds_numel if hasattr(p, "ds_numel") else p.numel()


def quantized_lora_model(base: str, kind: str) -> Any:
    """The base saved in folder ``base`` quantized as ``kind`` (one of :data:`BASES`; fp32 compute), prepared for
    k-bit training, with LoRA adapters (rank 4) on ``q_proj``/``v_proj`` seeded as ``finetune_common.lora_model``'s."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    if kind not in BASES:
        raise ValueError(f"kind={kind!r}: expected one of {BASES}")
    if kind == "int8":
        config = BitsAndBytesConfig(load_in_8bit=True)
    else:
        storage = {"nf4-fp32": torch.float32, "nf4-bf16": torch.bfloat16}.get(kind, torch.uint8)
        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_quant_storage=storage,
                                    bnb_4bit_compute_dtype=torch.bfloat16 if kind == "nf4-bf16" else torch.float32)
    model = LlamaForCausalLM.from_pretrained(base, quantization_config=config, device_map="cpu",
                                             dtype=torch.float32)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    torch.manual_seed(1)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


if __name__ == "__main__":
    main(*sys.argv[1:])
