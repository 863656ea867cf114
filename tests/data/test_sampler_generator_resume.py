"""F-CKPT-3, F-FT-6: a user's ``DataLoader`` shuffled by a ``RandomSampler`` with its own seeded ``generator``
resumes exactly, on one process and under DDP (where taskfit swaps in its per-rank split of the sampler's order),
including a resume into a later pass: the order of each epoch depends only on the generator's initial state and the
epoch, and equals the order a plain loop over the loader draws (pass after pass of the sampler), split
``rank::world_size`` under DDP."""

from __future__ import annotations

import pytest
import torch
from stream_common import N, Recorder
from taskfit import Fit
from test_stateful_stream import BATCH, Rows, _ddp_job


def _fit(out, max_steps: int, save_steps: int) -> Fit:
    return Fit(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=BATCH, save_steps=save_steps,
               disable_tqdm=True, report_to="none", lr_scheduler_type="constant")


def _random_loader():
    rows = Rows()
    sampler = torch.utils.data.RandomSampler(rows, generator=torch.Generator().manual_seed(7))
    return torch.utils.data.DataLoader(rows, batch_size=BATCH, sampler=sampler)


def _passes(count: int, world: int = 1, rank: int = 0) -> list[list[int]]:
    """The batches a plain loop draws: ``count`` passes of a ``RandomSampler`` over the seeded generator (each pass
    draws a permutation, and one more, empty, when it ends), this rank's share of each."""
    sampler = torch.utils.data.RandomSampler(range(N), generator=torch.Generator().manual_seed(7))
    out = []
    for _ in range(count):
        mine = list(sampler)[rank::world]
        out += [mine[i:i + BATCH] for i in range(0, len(mine), BATCH)]
    return out


def test_random_sampler_generator_resumes_into_a_later_pass_F_CKPT_3(tmp_path):
    """One process, 8 batches per pass: stopped at step 10 (in the second pass) and resumed to 14, the same batches
    and weights as the uninterrupted run, whose batches are the plain loop's."""
    full = Recorder()
    _fit(tmp_path / "full", 14, save_steps=100).fit(full, _random_loader())
    assert full.seen == _passes(2)[:14]
    _fit(tmp_path / "cut", 10, save_steps=10).fit(Recorder(), _random_loader())
    resumed = Recorder()
    _fit(tmp_path / "cut", 14, save_steps=10).fit(resumed, _random_loader(),
                                                  resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-10"))
    assert resumed.seen == full.seen[10:]
    assert torch.equal(resumed.layer.weight, full.layer.weight)


@pytest.mark.distributed
@pytest.mark.slow  # three two-process jobs
@pytest.mark.parametrize("loader", ["random", "torchdata_random"])
def test_random_sampler_generator_resumes_per_rank_under_ddp_F_FT_6(tmp_path, loader):
    """2 DDP processes, 4 batches per rank and pass, a plain ``DataLoader`` or torchdata's ``StatefulDataLoader``
    (which fast-forwards taskfit's split by reading it again): stopped at step 5 (in the second pass) and resumed to
    step 8, each rank gets the same batches and weights as the uninterrupted run, whose batches are the plain
    loop's order split per rank."""
    if loader.startswith("torchdata"):
        pytest.importorskip("torchdata.stateful_dataloader")
    full = _ddp_job(tmp_path / "a", "full", steps=8, save=8, loader=loader)
    _ddp_job(tmp_path / "b", "cut", steps=5, save=5, loader=loader)
    resumed = _ddp_job(tmp_path / "b", "resumed", steps=8, save=8, loader=loader,
                       resume=str(tmp_path / "b" / "out" / "checkpoint-5"))
    for rank in range(2):
        assert full[rank]["seen"] == _passes(2, 2, rank)
        assert resumed[rank]["seen"] == full[rank]["seen"][5:]
        assert resumed[rank]["weight"] == full[rank]["weight"]
