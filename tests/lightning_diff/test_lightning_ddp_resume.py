"""``taskfit.lightning.Trainer(strategy="ddp", devices=2)`` on CPU (2 gloo processes) resumes as one process does:
``trainer.fit(model, ckpt_path=...)`` restores the weights (after ``configure_model`` built them), the optimizer,
what ``on_load_checkpoint`` reads and the callbacks' state, so the resumed run ends with the uninterrupted run's
weights; both equal ``lightning.Trainer``'s under the same DDP run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs_common import run_job

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # four 2-process jobs (~1-2 min on 2 busy cores)
JOB = Path(__file__).with_name("door_resume_job.py")


def _runs(tmp_path: Path, framework: str) -> tuple[list[dict], list[dict]]:
    full = run_job(JOB, tmp_path, f"{framework}_full", {"framework": framework, "max_epochs": 2, "devices": 2})
    ckpt = str(tmp_path / f"{framework}_full" / "ckpt" / "epoch=0-step=4.ckpt")
    resumed = run_job(JOB, tmp_path, f"{framework}_resumed", {"framework": framework, "max_epochs": 2,
                                                              "devices": 2, "ckpt_path": ckpt})
    return full, resumed


def test_F_LIT_CKPT_ddp_resume_equals_the_uninterrupted_run_like_lightning(tmp_path):
    """32 samples, 4 per batch, 2 ranks: 4 steps per epoch; resumed from epoch 0's checkpoint (step 4)."""
    got = {fw: _runs(tmp_path, fw) for fw in ("taskfit", "lightning")}
    for fw, (full, resumed) in got.items():
        for f, r in zip(full, resumed, strict=True):
            assert r["layer_at_load"] is True and r["loaded"] == {"saved_at": 4}, fw
            assert (r["global_step"], r["epoch"], r["batches"]) == (f["global_step"], f["epoch"], f["batches"])
            assert (f["global_step"], f["batches"]) == (8, 8)
            for k, v in f["weights"].items():
                assert torch.equal(v, r["weights"][k]), (fw, k)
            assert all(torch.equal(a, b) for a, b in zip(f["momentum"], r["momentum"], strict=True)), fw
    for t, lt in zip(got["taskfit"][1], got["lightning"][1], strict=True):
        for k, v in lt["weights"].items():
            assert torch.allclose(t["weights"][k], v, rtol=1e-6, atol=1e-7), k
        assert (t["global_step"], t["epoch"], t["batches"]) == (lt["global_step"], lt["epoch"], lt["batches"])
