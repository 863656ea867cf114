"""LoRA under DDP (2 gloo processes, 2 rows each) equals one process on the batch of 4 (adapter weights within
1e-6, fp32 CPU); the DDP checkpoint holds the adapter (PEFT's layout), and resuming it under DDP is exact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from finetune_common import adapter_weights, equal_rows, lora_model  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 2 two-process jobs, ~1 min
JOB = Path(__file__).parent / "lora_ddp_job.py"


def _ddp(out: Path, *resume: str) -> dict[str, torch.Tensor]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    proc = subprocess.run([sys.executable, str(JOB), str(out), *resume], capture_output=True, text=True,
                          timeout=400, cwd=out.parent, env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "adapter.pt")


def test_lora_ddp_equals_one_process_and_resumes_F_FT_3(tmp_path):
    import taskfit.hf as m

    args = m.TrainingArguments(output_dir=str(tmp_path / "one"), per_device_train_batch_size=4, max_steps=4,
                               save_strategy="no", learning_rate=1e-2, report_to="none", use_cpu=True)
    one = m.Trainer(model=lora_model(), args=args, train_dataset=equal_rows(16))
    one.train()
    reference = adapter_weights(one.model)
    ddp = _ddp(tmp_path / "ddp")
    assert set(ddp) == set(reference)
    for k in reference:
        assert torch.allclose(ddp[k], reference[k], rtol=0, atol=1e-6), k
    names = set(os.listdir(tmp_path / "ddp" / "checkpoint-2"))
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names and "model.safetensors" not in names
    resumed = _ddp(tmp_path / "resumed", str(tmp_path / "ddp" / "checkpoint-2"))
    for k in ddp:
        assert torch.equal(resumed[k], ddp[k]), k
