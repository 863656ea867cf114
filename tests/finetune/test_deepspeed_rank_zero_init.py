"""Meta-device initialisation (``rank_zero_init``) under DeepSpeed ZeRO-2 and ZeRO-3 (F-FT-5): rank 0 builds a tied
Llama with real weights, rank 1 on the meta device; the strategy materialises rank 1's model and broadcasts rank 0's
weights into it before ``deepspeed.initialize`` (the broadcast the FSDP strategy uses). 2 gloo processes per run (the
job is ``deepspeed_init_job.py``): after set-up every rank holds rank 0's weights with the tie intact, and 2 steps
train to the same weights, bit for bit, as the same run with real weights built on every rank.

Peak memory of the meta rank, from building the model to the call of ``deepspeed.initialize`` (``ru_maxrss``; a
16-layer model of 63 MB fp32 whose largest tensor is 1 MB): under ZeRO-3 the strategy converts it submodule by
submodule with DeepSpeed's ``zero.Init`` (a broadcast from rank 0 and this rank's partition per parameter), so it stays
below one full copy and below the run with real weights on every rank (measured 48.6 MB against 72.1 MB); ZeRO-2
keeps the full parameters on every rank by design, so the meta rank holds one copy there and no more than the real
run (no second copy from the broadcast).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.distributed, pytest.mark.deepspeed, pytest.mark.slow]  # 2 two-process jobs per case
JOB = Path(__file__).parent / "deepspeed_init_job.py"
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED")


def run_job(out: Path, strategy: str, mode: str) -> tuple[list[dict], list[dict[str, torch.Tensor]]]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TASKFIT_DEEPSPEED_SHM_COMM="0")  # no JIT build of DeepSpeed's CPU comm op
    proc = subprocess.run([sys.executable, str(JOB), str(out), strategy, mode], capture_output=True, text=True,
                          timeout=560, cwd=out.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    return reports, [torch.load(f"{out}.rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("strategy", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_meta_device_init_under_deepspeed_gets_rank0_weights_and_trains_as_real_init_F_FT_5(tmp_path, strategy):
    reports, trained = run_job(tmp_path / "meta", strategy, "meta")
    assert [r["built_real"] for r in reports] == [True, False]
    for report in reports:
        assert report["tied_at_start"] and report["equal_to_rank0"] and report["tied_at_end"]
    real_reports, real_trained = run_job(tmp_path / "real", strategy, "real")
    assert [r["built_real"] for r in real_reports] == [True, True]
    for got, want in zip(trained, real_trained):
        assert sorted(got) == sorted(want) and "model.embed_tokens.weight" in got and "lm_head.weight" not in got
        for name in want:
            assert torch.equal(got[name], want[name]), (name, (got[name] - want[name]).abs().max())
        assert all(torch.equal(got[n], v) for n, v in trained[0].items())  # every rank holds the same weights
    model_bytes = reports[1]["model_bytes"]
    meta_peak, real_peak = reports[1]["peak_at_initialize_bytes"], real_reports[1]["peak_at_initialize_bytes"]
    assert real_peak > 0.9 * model_bytes, (real_peak, model_bytes)  # building real weights costs a copy
    if strategy == "deepspeed_stage_3":
        assert meta_peak < 0.9 * model_bytes and meta_peak < real_peak - model_bytes / 4, (meta_peak, real_peak)
    else:
        assert meta_peak <= real_peak + model_bytes / 10, (meta_peak, real_peak)
