"""Run by tests/finetune/test_adapter_variants.py: LoRA fine-tuning of the tiny Llama under ``taskfit.hf.Trainer``
on 2 gloo processes (taskfit re-launches this script per rank), 2 rows per process, 4 steps, a checkpoint every 2,
with the strategy named by the second argument and one of these variants (third argument):

- ``full``: FSDP with ``state_dict_type="full"`` (adapter-only checkpoints gathered on rank 0);
- ``multi``: two adapters (``default`` active, with ``modules_to_save=["lm_head"]``, and an inactive ``other``);
- ``best``: the ``multi`` model with an evaluation every 2 steps and ``load_best_model_at_end`` (the best being
  the first checkpoint: ``greater_is_better=True`` on a falling ``eval_loss``).

With a fourth argument the run resumes from that checkpoint. ``save_model`` then writes the adapters to
``{out}/final``."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from finetune_common import equal_rows, lora_model  # noqa: E402
from lora_parallel_job import SIZES  # noqa: E402

import taskfit.hf as m  # noqa: E402


def multi_adapter_model() -> Any:
    """:func:`finetune_common.lora_model` on the ``SIZES`` base with ``lm_head`` as a module to save, plus a second,
    inactive LoRA adapter ``other`` on ``v_proj`` (seeded: two calls build the same model)."""
    import torch
    from peft import LoraConfig

    model = lora_model(sizes=SIZES, modules_to_save=["lm_head"])
    torch.manual_seed(5)
    model.add_adapter("other", LoraConfig(r=2, lora_alpha=4, target_modules=["v_proj"], lora_dropout=0.0,
                                          init_lora_weights=False))
    model.set_adapter("default")
    return model


def main(out: str, strategy: str, variant: str, resume: str = "") -> None:
    options: dict[str, Any] = {}
    if variant == "full":
        options["fsdp_config"] = {"state_dict_type": "full"}
    if variant == "best":
        options.update(eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2, load_best_model_at_end=True,
                       metric_for_best_model="eval_loss", greater_is_better=True)
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=4, save_steps=2,
                               learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True,
                               disable_tqdm=True, ddp_backend="gloo", ddp_timeout=300, **options)
    model = lora_model(sizes=SIZES) if variant == "full" else multi_adapter_model()
    trainer = m.Trainer(model=model, args=args, train_dataset=equal_rows(16), strategy=strategy, devices=2,
                        eval_dataset=equal_rows(8) if variant == "best" else None)
    trainer.train(resume_from_checkpoint=resume or None)
    trainer.save_model(os.path.join(out, "final"))
    if trainer.is_world_process_zero():
        print("best:", trainer.state.best_model_checkpoint)


if __name__ == "__main__":
    main(*sys.argv[1:])
