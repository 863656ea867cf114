"""LoRA under FSDP2 and DeepSpeed ZeRO-2/3 (2 gloo processes, 2 rows each) equals one process on the batch of 4
(adapter weights within 1e-6, fp32 CPU); their ``checkpoint-N`` holds the adapter, not the frozen base: PEFT's
``adapter_model.safetensors`` + ``adapter_config.json`` gathered on rank 0 (as ``transformers.Trainer`` writes them,
readable by ``PeftModel.from_pretrained``) plus the strategy's shards of the adapter and its optimizer state for
resume (accelerate's ``save_fsdp_model(adapter_only=True)``, DeepSpeed's ``exclude_frozen_parameters``, as HF's
Trainer saves a PEFT model); resuming one is bitwise equal to the uninterrupted run (same processes, same
collectives in the same order)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from finetune_common import equal_rows, lora_model, tiny_llama  # noqa: E402
from lora_parallel_job import SIZES  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 2 two-process jobs per case, ~1-3 min each on 2 cores
JOB = Path(__file__).parent / "lora_parallel_job.py"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED")
#: ZeRO-3 reduce-scatters gradients into fp32 partitions: after 4 AdamW steps, measured max difference 4.5e-6 on
#: layer 0's q_proj LoRA B (1.6e-6 on its A; every other adapter tensor within 2.2e-7): Adam divides by the root
#: of the squared gradient, so where gradients are near zero it enlarges their reduction-order rounding
TOL = {"deepspeed_stage_3": 1e-5}
#: the files that hold tensors (weights, optimizer state, shards); the rest is JSON, RNG and loop state
TENSOR_FILES = (".safetensors", ".bin", ".distcp", "_states.pt", "optimizer.pt")


def run_job(out: Path, strategy: str, resume: str = "", base: str = "") -> dict[str, torch.Tensor]:
    """Run the job (it launches its 2 processes) and return the adapter ``save_model`` wrote (PEFT's keys)."""
    from safetensors.torch import load_file

    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TASKFIT_DEEPSPEED_SHM_COMM="0")  # no JIT build of DeepSpeed's shm op
    proc = subprocess.run([sys.executable, str(JOB), str(out), strategy, resume, base], capture_output=True,
                          text=True, timeout=560, cwd=out.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out / "final" / "adapter_model.safetensors"))


def one_process(model: torch.nn.Module, out: Path) -> dict[str, torch.Tensor]:
    """The same 4 steps on one process with 4 rows per step; the adapter with PEFT's keys."""
    from peft import get_peft_model_state_dict

    import taskfit.hf as m

    args = m.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=4,
                               save_strategy="no", learning_rate=1e-2, report_to="none", use_cpu=True)
    m.Trainer(model=model, args=args, train_dataset=equal_rows(16)).train()
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def assert_close(got: dict, want: dict, tol: float) -> None:
    assert set(got) == set(want) and want
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=0, atol=tol), (k, (got[k] - want[k]).abs().max())


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_lora_sharded_equals_one_process_and_resumes_from_adapter_checkpoint_F_FT_3(strategy, tmp_path):
    """Equivalence, checkpoint content and size, exact resume (module docstring)."""
    pytest.importorskip("deepspeed") if strategy.startswith("deepspeed") else None
    from peft import PeftModel

    reference = one_process(lora_model(sizes=SIZES), tmp_path / "one")
    full = run_job(tmp_path / "run", strategy)
    assert_close(full, reference, TOL.get(strategy, 1e-6))  # the same sums reduced in another order

    ckpt = tmp_path / "run" / "checkpoint-2"
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    names = {p.relative_to(ckpt).as_posix() for p in files}
    assert {"adapter_model.safetensors", "adapter_config.json", "scheduler.pt", "trainer_state.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin"}
    base_bytes = sum(p.numel() * p.element_size() for p in tiny_llama(**SIZES).parameters())
    tensor_bytes = sum(p.stat().st_size for p in files if p.name.endswith(TENSOR_FILES))
    # adapter-sized: no copy of the frozen base (1.25 MB); measured 164 KB under FSDP (DCP's per-tensor framing
    # of 16 small tensors and their optimizer states on 2 ranks), ~90 KB under ZeRO-3; the adapter itself is 14 KB
    assert tensor_bytes < base_bytes / 4, (tensor_bytes, base_bytes)
    loaded = PeftModel.from_pretrained(tiny_llama(**SIZES), str(ckpt))  # PEFT reads the checkpoint as it is
    assert sum(p.numel() for n, p in loaded.named_parameters() if "lora_" in n) == sum(v.numel() for v in full.values())

    resumed = run_job(tmp_path / "resumed", strategy, str(ckpt))
    assert_close(resumed, full, 0.0)  # bitwise
