"""Run by tests/finetune/test_lora_ddp.py: LoRA fine-tuning of the tiny Llama under ``taskfit.hf.Trainer`` with
``strategy="ddp"`` on 2 gloo processes (taskfit re-launches this script per rank), 2 rows per process; with a
third argument, resumed from that checkpoint. Rank 0 writes the adapter weights to ``{out}/adapter.pt``."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import adapter_weights, equal_rows, lora_model  # noqa: E402

import taskfit.hf as m  # noqa: E402


def main(out: str, resume: str | None = None) -> None:
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=4, save_steps=2,
                               learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                               disable_tqdm=True, ddp_backend="gloo")
    trainer = m.Trainer(model=lora_model(), args=args, train_dataset=equal_rows(16), strategy="ddp", devices=2)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        torch.save(adapter_weights(trainer.model), os.path.join(out, "adapter.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
