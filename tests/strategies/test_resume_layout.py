"""F-SCALE-2: resuming at an epoch boundary with another global batch (another number of data-parallel processes
with the same per-device batch, or another ``gradient_accumulation_steps``) and so another number of optimizer
steps per epoch. The rule (``taskfit.checkpoint.resume.plan_resumed_run``): the loop keeps ``global_step`` and the data
position of the checkpoint; under ``max_steps`` the run ends at ``global_step == max_steps`` (as HF and
Lightning); under ``num_train_epochs`` it trains the epochs that are left on the new layout (Lightning's
``max_epochs`` rule) and ``max_steps`` - the LR schedule's length - becomes the steps actually left. Before, the
epochs were re-derived from ``max_steps`` of a fresh plan and a run stopped early (after 2 of 3 epochs with twice
the processes, at once with half of them under ``max_steps``).

32 samples, ``per_device_train_batch_size=4``: the 2-process source run takes 4 steps per epoch; one process takes
8, four processes (or 2 with accumulation 2) take 2."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mp_helpers import run_job  # noqa: E402

LR = 0.05  # mp_job's learning rate (linear decay to 0, no warm-up: HF's default schedule)
EPOCHS = {"num_train_epochs": 3, "max_steps": -1}


def _steps(result: dict, after: int) -> list[int]:
    """The steps logged after the resume (the restored log history holds the earlier ones)."""
    return [r["step"] for r in result["log"] if "loss" in r and r["step"] > after]


def _lrs(result: dict) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in result["log"] if "learning_rate" in r}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """2 DDP processes, 3 epochs of 4 steps, a checkpoint at every epoch's end (steps 4, 8, 12)."""
    tmp = tmp_path_factory.mktemp("source")
    got = run_job(tmp, "src", bs=4, strategy="ddp", devices=2, args={**EPOCHS, "save_strategy": "epoch"})
    assert got["plan"]["global_step"] == 12 and got["positions"][-1] == (2, 4)
    return str(tmp / "src")


TARGETS = {  # name: (layout, steps per epoch)
    "one_process": (dict(bs=4), 8),
    "four_processes": (dict(bs=4, strategy="ddp", devices=4), 2),
    "accumulation_2": (dict(bs=4, strategy="ddp", devices=2, accum=2), 2),
}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_F_SCALE_2_num_train_epochs_resume_with_another_global_batch_trains_the_epochs_left(target, tmp_path,
                                                                                            source):
    """F-SCALE-2: resumed after epoch 0 of 3, the run trains epochs 1 and 2 whole on the new layout (every
    micro-batch of each, none skipped or repeated), ends at epoch 3.0 with ``max_steps`` = the steps it took, and
    its linear LR schedule reaches its last step there (lr x 1/max_steps), instead of stopping after epoch 1
    (twice the global batch) or leaving the schedule unfinished (half of it)."""
    layout, per_epoch = TARGETS[target]
    accum = layout.get("accum", 1)
    got = run_job(tmp_path, target, resume=os.path.join(source, "checkpoint-4"), args=EPOCHS, **layout)
    end = 4 + 2 * per_epoch
    assert got["plan"]["global_step"] == end and got["plan"]["max_steps"] == end
    assert got["plan"]["epoch"] == 3.0 and got["plan"]["num_train_epochs"] == 3
    assert got["positions"] == [(e, b * accum) for e in (1, 2) for b in range(1, per_epoch + 1)]
    assert _steps(got, 4) == list(range(5, end + 1))
    lrs = _lrs(got)  # step 5 runs with the checkpoint's rate; the scheduler then follows the new plan
    assert [lrs[k] for k in range(6, end + 1)] == pytest.approx([LR * (end + 1 - k) / end for k in range(6, end + 1)])


MAX_STEPS_TARGETS = {  # name: (layout, positions of steps 9-12)
    "one_process": (dict(bs=4), [(2, 1), (2, 2), (2, 3), (2, 4)]),
    "four_processes": (dict(bs=4, strategy="ddp", devices=4), [(2, 1), (2, 2), (3, 1), (3, 2)]),
}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("target", list(MAX_STEPS_TARGETS))
def test_F_SCALE_2_max_steps_resume_with_another_global_batch_ends_at_max_steps(target, tmp_path, source):
    """F-SCALE-2: ``max_steps=12`` resumed after epoch 1 (step 8) takes steps 9-12 wherever they fall on the new
    layout: in epoch 2 on one process (8 steps per epoch; a fresh plan's 2 epochs would have ended the run at
    once), across epochs 2 and 3 on four."""
    layout, positions = MAX_STEPS_TARGETS[target]
    got = run_job(tmp_path, target, resume=os.path.join(source, "checkpoint-8"), steps=12,
                  args={"max_steps": 12}, **layout)
    assert got["plan"]["global_step"] == 12 and got["plan"]["max_steps"] == 12
    assert got["positions"] == positions
    assert _steps(got, 8) == [9, 10, 11, 12]


def test_F_SCALE_2_resume_plan_rule_on_one_process(tmp_path):
    """F-SCALE-2: the same rule on one process, where the global batch changes with the per-device batch
    (8 -> 4 and 8 -> 16 samples per step) and with the accumulation (1 -> 2) resumed at an epoch's end, plus a
    mid-epoch resume with another accumulation (kept, with a warning: the position is in micro-batches)."""
    import mp_job

    out = str(tmp_path / "src")
    base = {"out": out, "args": {**EPOCHS, "save_strategy": "steps", "save_steps": 2}}
    src = mp_job.run({**base, "bs": 8})  # 4 steps per epoch, checkpoints every 2 steps
    assert src["plan"]["global_step"] == 12
    half = mp_job.run({**base, "out": str(tmp_path / "a"), "bs": 4, "resume": os.path.join(out, "checkpoint-4")})
    assert half["plan"]["global_step"] == 4 + 16 and half["plan"]["epoch"] == 3.0
    double = mp_job.run({**base, "out": str(tmp_path / "b"), "bs": 16, "resume": os.path.join(out, "checkpoint-4")})
    assert double["plan"]["global_step"] == 4 + 4 and double["positions"] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    # mid-epoch (checkpoint-6: 2 of epoch 1's 4 batches), accumulation 1 -> 2: the 2 batches left make 1 step
    mid = mp_job.run({**base, "out": str(tmp_path / "c"), "bs": 8, "accum": 2,
                      "resume": os.path.join(out, "checkpoint-6")})
    assert mid["positions"] == [(1, 4), (2, 2), (2, 4)] and mid["plan"]["max_steps"] == 6 + 3
