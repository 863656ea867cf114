"""QLoRA under data parallel: a bitsandbytes nf4 base with LoRA adapters under DDP (2 gloo processes, 2 rows each)
equals one process on the batch of 4 (adapter weights within 1e-6, fp32 compute); under FSDP and DeepSpeed ZeRO-3,
which shard every parameter, a base stored in uint8 (bitsandbytes' default) is refused before any process starts,
naming the strategy, ``bnb_4bit_quant_storage`` and what works (accelerate leaves uint8 4-bit weights out of FSDP2's
sharding; taskfit does not shard them). ZeRO-2 and float storage: tests/finetune/test_qlora_sharded.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from finetune_common import equal_rows  # noqa: E402
from lora_parallel_job import qlora_model  # noqa: E402


@pytest.mark.distributed
@pytest.mark.slow  # one two-process job, ~1-2 min on 2 cores
def test_qlora_ddp_equals_one_process_on_the_doubled_batch_F_FT_3(tmp_path, base_dir):
    from bitsandbytes.nn import Linear4bit
    from test_lora_sharded import assert_close, one_process, run_job

    model = qlora_model(base_dir)
    assert isinstance(model.get_base_model().model.layers[0].mlp.up_proj, Linear4bit)
    reference = one_process(model, tmp_path / "one")
    ddp = run_job(tmp_path / "ddp", "ddp", "", base_dir)
    assert_close(ddp, reference, 1e-6)
    names = {p.name for p in (tmp_path / "ddp" / "checkpoint-2").iterdir()}
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_3"])
def test_quantized_base_under_sharding_is_refused_before_any_work_F_FT_3(tmp_path, base_dir, strategy):
    """2 processes are asked for; the error comes before the launcher starts the second one (no process group,
    no output folder), naming the strategy, the quantization and the strategies that work."""
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    import taskfit.hf as m

    args = m.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2,
                               report_to="none", use_cpu=True, ddp_backend="gloo")
    trainer = m.Trainer(model=qlora_model(base_dir), args=args, train_dataset=equal_rows(8), strategy=strategy,
                        devices=2)
    detail = f" \\(ZeRO-{strategy[-1]}\\)" if strategy.startswith("deepspeed") else ""
    with pytest.raises(ValueError, match=f"strategy='{strategy.split('_')[0]}'{detail} cannot train a base quantized "
                                         "with bitsandbytes .*bnb_4bit_quant_storage.*strategy='ddp'"):
        trainer.train()
    assert not (tmp_path / "out").exists() and not torch.distributed.is_initialized()
