"""Under ``strategy="ddp", devices=2`` (2 gloo processes on CPU) the door gives the training loader Lightning's
``DistributedSampler(shuffle=True, seed=PL_GLOBAL_SEED or 0)``, re-ordered each epoch by ``set_epoch``: every rank
trains the batches it trains under ``lightning.Trainer``, in the same order, over 2 epochs, and the final weights
are bitwise equal (``Fit`` keeps splitting the given order: tests/strategies)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs_common import run_job

JOB = Path(__file__).with_name("door_resume_job.py")


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("inner", ["list", "epoch_sampler"])
def test_F_LIT_DDP_custom_sampler_split_like_lightnings_wrapper(shuffle, inner):
    """A loader's own sampler (not Random/Sequential) is split as Lightning's ``DistributedSamplerWrapper`` splits
    it: the same indices per rank and epoch (``set_epoch``, passed on to a sampler that has it), 3 ranks over 10
    indices (padded), no process group."""
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    from taskfit.data.samplers import EpochRandomSampler
    from taskfit.data.shuffled_split import SamplerSplit

    def sampler():
        return [7, 3, 9, 0, 4, 8, 1, 6, 2, 5] if inner == "list" else EpochRandomSampler(10, seed=1)

    for rank in range(3):
        ours = SamplerSplit(sampler(), 3, rank, shuffle, seed=5)
        theirs = DistributedSamplerWrapper(sampler(), num_replicas=3, rank=rank, shuffle=shuffle, seed=5)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs) == 4


@pytest.mark.distributed
@pytest.mark.slow  # 2-process jobs under both Trainers
@pytest.mark.parametrize("cfg", [{}, {"shuffle": True, "seed": 3}, {"use_distributed_sampler": False}],
                         ids=["in_order", "shuffled_seeded", "no_distributed_sampler"])
def test_F_LIT_DDP_training_sampler_shuffles_like_lightning(tmp_path, cfg):
    """F-LIT-DOOR: a loader in order (seed 0), a shuffling one after ``seed_everything(3)``, and
    ``use_distributed_sampler=False`` (every rank reads the whole loader, in order): per-rank batches (each batch's
    input sum, in order) and weights equal to Lightning's."""
    got = {name: run_job(JOB, tmp_path, name, {"framework": name, "max_epochs": 2, "devices": 2, **cfg})
           for name in ("lightning", "taskfit")}
    per_epoch = 8 if cfg.get("use_distributed_sampler") is False else 4  # batches per epoch per rank
    for lit, door in zip(got["lightning"], got["taskfit"], strict=True):
        assert door["rank"] == lit["rank"]
        assert door["seen"] == lit["seen"] and len(lit["seen"]) == 2 * per_epoch
        for k, v in lit["weights"].items():
            assert torch.equal(v, door["weights"][k]), k
    seen = got["lightning"][0]["seen"]
    # set_epoch re-ordered the second epoch; the loader as given reads the same order twice
    assert (seen[:per_epoch] == seen[per_epoch:]) == (cfg.get("use_distributed_sampler") is False)
