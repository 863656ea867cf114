"""``taskfit.lightning.Trainer(strategy="ddp", devices=2)`` on CPU (2 gloo processes) resumes as one process does:
``trainer.fit(model, ckpt_path=...)`` restores the weights (after ``configure_model`` built them), the optimizer,
what ``on_load_checkpoint`` reads and the callbacks' state, so the resumed run trains the batches the uninterrupted
run trained after the checkpoint and ends with its weights and optimizer state, bitwise; a logger of the user's own
is called on every process.

(The uninterrupted run's batches per rank and weights equal ``lightning.Trainer``'s: test_lightning_ddp_sampler.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs_common import run_job

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two 2-process jobs (~1 min on 2 busy cores)
JOB = Path(__file__).with_name("door_resume_job.py")


def test_F_LIT_CKPT_ddp_resume_equals_the_uninterrupted_run(tmp_path):
    """32 samples, 4 per batch, 2 ranks: 4 steps per epoch; resumed from epoch 0's checkpoint (step 4)."""
    cfg = {"framework": "taskfit", "max_epochs": 2, "devices": 2}
    full = run_job(JOB, tmp_path, "full", cfg)
    ckpt = str(tmp_path / "full" / "ckpt" / "epoch=0-step=4.ckpt")
    resumed = run_job(JOB, tmp_path, "resumed", {**cfg, "ckpt_path": ckpt})
    for f, r in zip(full, resumed, strict=True):
        assert r["layer_at_load"] is True and r["loaded"] == {"saved_at": 4}
        assert f["loaded"] is None
        assert (r["global_step"], r["epoch"], r["batches"]) == (f["global_step"], f["epoch"], f["batches"]) == \
            (8, 2, 8)  # the callback's count went on from the checkpoint's 4
        assert r["seen"] == f["seen"][4:]  # the second epoch's batches of this rank, in order
        for k, v in f["weights"].items():
            assert torch.equal(v, r["weights"][k]), k
        assert all(torch.equal(a, b) for a, b in zip(f["momentum"], r["momentum"], strict=True))
    assert full[0]["seen"] != full[1]["seen"]  # each rank trained its own share
    # a logger of the user's own is called on every process with that process's values (Lightning calls every
    # logger on every process); the resumed run logs the steps after the checkpoint
    for run in (full, resumed):
        steps = [[s for s, _ in r["rows"] if s is not None] for r in run]
        assert steps[0] == steps[1] and steps[0]
    assert [s for s, _ in resumed[1]["rows"]][0] >= 4
    assert [row["loss"] for _, row in full[0]["rows"]] != [row["loss"] for _, row in full[1]["rows"]]
