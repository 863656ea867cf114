"""QLoRA under sharding (2 gloo processes, 2 rows each) equals one process on the batch of 4 (adapter weights within
1e-6, fp32 compute; 2e-6 for an 8-bit base):
- DeepSpeed ZeRO-1/2 with a bitsandbytes nf4 (uint8 storage) or LLM.int8() base: ZeRO flattens and partitions only
  what trains (the adapters' gradients and optimizer state); the frozen quantized weights stay whole module
  parameters on every rank, as under DDP;
- FSDP2 and ZeRO-3 with an nf4 base stored in float32 (``bnb_4bit_quant_storage``, accelerate's FSDP-QLoRA recipe):
  each rank holds about half of the frozen base.
``checkpoint-N`` holds the adapter only (no quantized weight, no quantization constant) and resuming one is bitwise
equal to the uninterrupted run. Bases that sharding would corrupt are refused before any process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from qlora_sharded_job import quantized_lora_model  # noqa: E402

JOB = Path(__file__).parent / "qlora_sharded_job.py"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED")
#: LLM.int8(): after 4 AdamW steps, measured max difference 1.06e-6 on layer 1's q_proj LoRA A (every other adapter
#: tensor within 3e-8): A's gradient is zero at the first step (B starts at zero) and tiny after it, and Adam's
#: division by the root of the squared gradient enlarges the reduction-order rounding of such gradients
TOL = {"int8": 2e-6}


def run_job(out: Path, strategy: str, base: str, kind: str, resume: str = "") -> dict[str, torch.Tensor]:
    """Run the job (it launches its 2 processes) and return the adapter ``save_model`` wrote (PEFT's keys)."""
    from safetensors.torch import load_file

    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TASKFIT_DEEPSPEED_SHM_COMM="0")  # no JIT build of DeepSpeed's shm op
    proc = subprocess.run([sys.executable, str(JOB), str(out), strategy, resume, base, kind], capture_output=True,
                          text=True, timeout=560, cwd=out.parent, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out / "final" / "adapter_model.safetensors"))


def saved_model_keys(ckpt: Path, strategy: str) -> list[str]:
    """The model keys of the strategy's shards in ``ckpt`` (DeepSpeed's engine files, read as taskfit's resume reads
    them; FSDP's distributed-checkpoint metadata)."""
    if strategy == "fsdp":
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(str(ckpt / "shards")).read_metadata().state_dict_metadata
        return [k for k in keys if k.startswith("model.")]
    from taskfit.strategies.deepspeed_files import load_engine_file

    files = sorted((ckpt / "shards" / "deepspeed").glob("*model_states.pt"))
    assert files
    return sorted({k for f in files for k in load_engine_file(f.read_bytes(), str(f))["module"]})


CASES = [("deepspeed_stage_2", "nf4"), ("deepspeed_stage_2", "int8"), ("deepspeed_stage_1", "nf4"),
         ("deepspeed_stage_2", "nf4-fp32"), ("fsdp", "nf4-fp32"), ("deepspeed_stage_3", "nf4-fp32")]


@pytest.mark.distributed
@pytest.mark.slow  # three two-process jobs per case, ~1 min each on 2 cores
@pytest.mark.parametrize(("strategy", "kind"), CASES)
def test_qlora_sharded_equals_one_process_and_resumes_from_adapter_checkpoint_F_FT_3(strategy, kind, tmp_path,
                                                                                      base_dir):
    """Equivalence, what each rank holds of the frozen base, adapter-only checkpoint, exact resume (module
    docstring)."""
    pytest.importorskip("deepspeed") if strategy.startswith("deepspeed") else None
    from test_lora_sharded import assert_close, one_process

    reference = one_process(quantized_lora_model(base_dir, kind), tmp_path / "one")
    if strategy == "fsdp":  # float storage holds the same nf4 codes: the same training as uint8 storage
        assert_close(one_process(quantized_lora_model(base_dir, "nf4"), tmp_path / "uint8"), reference, 0.0)
    full = run_job(tmp_path / "run", strategy, base_dir, kind)
    assert_close(full, reference, TOL.get(kind, 1e-6))  # the same sums reduced in another order

    for rank in range(2):  # FSDP2 and ZeRO-3 shard the frozen quantized base, ZeRO-1/2 keep it whole
        held = json.loads((tmp_path / "run" / f"frozen_rank{rank}.json").read_text())
        shards = strategy in ("fsdp", "deepspeed_stage_3")
        assert held["local"] < 0.6 * held["full"] if shards else held["local"] == held["full"], held
    ckpt = tmp_path / "run" / "checkpoint-2"
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin"}
    keys = saved_model_keys(ckpt, strategy)  # exclude_frozen_parameters alone would keep weight.absmax, SCB...
    assert len(keys) == len(full) and all(".lora_A." in k or ".lora_B." in k for k in keys), keys

    resumed = run_job(tmp_path / "resumed", strategy, base_dir, kind, str(ckpt))
    assert_close(resumed, full, 0.0)  # bitwise


#: (strategy, base, bf16, the error): 8-bit and uint8 storage under FSDP/ZeRO-3, float32 storage under bf16
REFUSED = [
    ("fsdp", "int8", False, (r"strategy='fsdp' cannot train a base quantized with bitsandbytes \(PeftModel\): "
                             r"its weights are stored as \['torch.int8'\].*bnb_4bit_quant_storage=torch.float32")),
    ("deepspeed_stage_3", "nf4", False, (r"strategy='deepspeed' \(ZeRO-3\) cannot train .* stored as "
                                         r"\['torch.uint8'\].*bnb_4bit_quant_storage.*strategy='ddp'")),
    ("fsdp", "nf4-fp32", True, (r"strategy='fsdp' with precision='bf16-mixed' needs the packed 4-bit weights .* "
                                r"stored in torch.bfloat16.*stored as \['torch.float32'\].*"
                                r"bnb_4bit_quant_storage=torch.bfloat16")),
    ("deepspeed_stage_2", "nf4-fp32", True, r"strategy='deepspeed' \(ZeRO-2\) with precision='bf16-mixed' needs"),
]


@pytest.mark.parametrize(("strategy", "kind", "bf16", "match"), REFUSED,
                         ids=["fsdp-int8", "zero3-uint8", "fsdp-float32-storage-bf16", "zero2-float32-storage-bf16"])
def test_quantized_base_that_sharding_would_corrupt_is_refused_before_any_work_F_FT_3(strategy, kind, bf16, match,
                                                                                      tmp_path, base_dir):
    """8-bit and uint8-stored 4-bit weights under FSDP or ZeRO-3, and float-stored 4-bit weights in another dtype
    than the precision's (which FSDP/DeepSpeed would cast value by value): the error comes before the launcher
    starts the second process, naming the storage and the configuration that works."""
    import taskfit.hf as m
    from finetune_common import equal_rows

    pytest.importorskip("deepspeed") if strategy.startswith("deepspeed") else None
    args = m.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2,
                               report_to="none", use_cpu=True, ddp_backend="gloo", bf16=bf16)
    trainer = m.Trainer(model=quantized_lora_model(base_dir, kind), args=args, train_dataset=equal_rows(8),
                        strategy=strategy, devices=2)
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert not (tmp_path / "out").exists() and not torch.distributed.is_initialized()


def test_packed_4bit_weights_in_a_float_storage_are_not_checked_for_nan_F_FT_3(base_dir):
    """Packed 4-bit codes stored in bfloat16 include NaN bit patterns (valid codes, frozen): the non-finite check
    that stops a run skips them, and still sees a NaN in a value parameter."""
    from taskfit.loops.finite import all_finite

    model = quantized_lora_model(base_dir, "nf4-bf16")
    packed = [n for n, p in model.named_parameters() if type(p).__name__ == "Params4bit"]
    assert any(not torch.isfinite(p).all() for n, p in model.named_parameters() if n in packed)  # as measured
    assert bool(all_finite(model))
    lora = next(p for n, p in model.named_parameters() if "lora_A" in n)
    with torch.no_grad():
        lora[0, 0] = float("nan")
    assert not bool(all_finite(model))
