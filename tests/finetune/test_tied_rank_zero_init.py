"""Meta-device initialisation (``rank_zero_init``) of a model with tied weights: a tiny Llama with
``tie_word_embeddings=True`` built real on rank 0 and on the meta device on rank 1 (2 gloo processes; the job is
``tied_init_job.py``). Under DDP and FSDP2 the materialised rank keeps ``lm_head.weight is embed_tokens.weight``,
starts from rank 0's weights and trains to the same weights as one process on the doubled batch (within 1e-6)
(F-FT-5). DeepSpeed ZeRO-2/3: ``test_deepspeed_rank_zero_init.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from finetune_common import equal_rows  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # one two-process job per case, ~1 min on 2 cores
JOB = Path(__file__).parent / "tied_init_job.py"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED")


def run_job(out: Path, strategy: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TASKFIT_DEEPSPEED_SHM_COMM="0")
    return subprocess.run([sys.executable, str(JOB), str(out), strategy], capture_output=True, text=True,
                          timeout=560, cwd=out.parent, env=env)


def one_process(tmp_path: Path) -> dict[str, torch.Tensor]:
    """The job's module, 2 steps on one process with 4 rows per step (real weights: one process has no meta rank)."""
    from tied_init_job import TiedLlama

    from taskfit import Fit

    module = TiedLlama()
    Fit(output_dir=str(tmp_path / "one"), max_steps=2, per_device_train_batch_size=4, save_strategy="no",
        disable_tqdm=True, report_to="none", lr_scheduler_type="constant").fit(module, equal_rows(8))
    assert module._tied()
    return {n: p.detach() for n, p in module.llm.named_parameters()}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_tied_weights_survive_meta_device_init_F_FT_5(tmp_path, strategy):
    proc = run_job(tmp_path / "run", strategy)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"run.rank{r}.json").read_text()) for r in range(2)]
    assert [r["built_real"] for r in ranks] == [True, False]
    for report in ranks:
        assert report["tied_at_start"] and report["equal_to_rank0"] and report["tied_at_end"]
    assert ranks[0]["end"] == ranks[1]["end"]
    reference = one_process(tmp_path)
    for name, values in ranks[1]["end"].items():
        assert torch.allclose(torch.tensor(values), reference[name], rtol=0, atol=1e-6), name
    assert "model.embed_tokens.weight" in ranks[1]["end"] and "lm_head.weight" not in ranks[1]["end"]

