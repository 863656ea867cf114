"""F-LOOP-6, F-CKPT-2: one restore point. The run's plan (step budget, intervals, batch layout) is a ``RunPlan``
apart from the restored state, so a resume loads the progress and the new run's plan stays; a checkpoint taken
after an epoch's end records the next epoch's start (older files that marked it with ``loop.epoch_done`` read the
same), and the restored RNG states are applied once."""

import random

import pytest
import torch

from taskfit.loops.plan import RunPlan
from taskfit.loops.state import FitControl, FitState, LossSums, TrainingState, plan_fields, upgrade_training_state

PLAN = {"max_steps", "num_train_epochs", "batches_per_epoch", "logging_steps", "eval_steps", "save_steps",
        "train_batch_size", "is_local_process_zero", "is_world_process_zero"}


def _saved(**state):
    """A version-2 training state: the plan fields inside ``state``, as files written before the split hold them."""
    return {"version": 2, "state": FitState(**state).flat_dict(), "control": {}, "precision": {}, "callbacks": {},
            "results": {}, "loop": {"tr_loss_per_rank": torch.tensor([1.5]), "steps_since_log": 1,
                                    "total_loss": 3.0, "epoch_done": False, "grad_norm": None}}


def test_F_LOOP_6_state_dict_holds_no_plan_and_the_plan_is_saved_apart():
    """FitState's state_dict is the progress only; TrainingState saves the plan under its own key; HF's plan
    attributes read the plan; setting one (as HF code sets TrainerState's) replaces the frozen plan."""
    assert set(plan_fields()) == PLAN
    plan = RunPlan(max_steps=12, logging_steps=3, batches_per_epoch=6, train_batch_size=4)
    state = FitState(plan=plan, global_step=5)
    assert not PLAN & set(state.state_dict()) and state.state_dict()["global_step"] == 5
    assert (state.max_steps, state.logging_steps, state.batches_per_epoch, state.train_batch_size) == (12, 3, 6, 4)
    saved = TrainingState(state, FitControl(), LossSums()).state_dict()
    assert saved["version"] == 4 and saved["plan"] == plan.state_dict() and not PLAN & set(saved["state"])
    assert "epoch_done" not in saved["loop"]
    state.save_steps = 7
    assert state.plan == plan.replace(save_steps=7) and plan.save_steps == 500 and state.save_steps == 7
    with pytest.raises(AttributeError):  # frozen: a re-plan makes a new one
        plan.max_steps = 3
    with pytest.raises(TypeError, match="unknown fields \\['max_step'\\]"):
        FitState(max_step=3)


@pytest.mark.parametrize("version", [2, 4])
def test_F_LOOP_6_resume_loads_progress_and_keeps_the_new_runs_plan(version):
    """Load, then continue: the saved progress is loaded, the new run's plan is not touched (its object is the
    same), whatever the saved file's version (old files hold the plan inside ``state``)."""
    old_plan = dict(max_steps=10, logging_steps=2, batches_per_epoch=5, is_world_process_zero=True)
    if version == 2:
        saved = _saved(global_step=7, current_epoch=1, batch_in_epoch=3, **old_plan)
    else:
        saved = TrainingState(FitState(global_step=7, current_epoch=1, batch_in_epoch=3, **old_plan),
                              FitControl(), LossSums()).state_dict()
    new_plan = RunPlan(max_steps=20, logging_steps=4, batches_per_epoch=9, is_world_process_zero=False)
    state = FitState(plan=new_plan)
    TrainingState(state, FitControl(), LossSums()).load_state_dict(saved)
    assert (state.global_step, state.current_epoch, state.batch_in_epoch) == (7, 1, 3)
    assert state.plan is new_plan and (state.max_steps, state.logging_steps, state.batches_per_epoch) == (20, 4, 9)
    assert upgrade_training_state(saved)["plan"]["batches_per_epoch"] == 5  # the old run's layout, for the checks


def test_F_CKPT_2_epoch_end_checkpoint_is_the_next_epochs_start_in_every_version():
    """An epoch's end is written as the next epoch's start; a version-2 file (epoch_done) reads the same."""
    state = FitState(global_step=6, current_epoch=1, batch_in_epoch=5)
    live = TrainingState(state, FitControl(), LossSums())
    live.epoch_ended = True
    new = live.state_dict()
    assert new["version"] == TrainingState.VERSION and "epoch_done" not in new["loop"]
    assert (new["state"]["current_epoch"], new["state"]["batch_in_epoch"]) == (2, 0)
    assert (state.current_epoch, state.batch_in_epoch) == (1, 5)  # the live state is not touched
    old = _saved(global_step=6, current_epoch=1, batch_in_epoch=5)
    old["loop"]["epoch_done"] = True
    assert upgrade_training_state(old)["state"]["current_epoch"] == 2 and old["state"]["current_epoch"] == 1
    for saved in (new, old):
        restored = FitState()
        TrainingState(restored, FitControl(), LossSums()).load_state_dict(saved)
        assert (restored.global_step, restored.current_epoch, restored.batch_in_epoch) == (6, 2, 0)


def test_F_LOOP_6_restored_rng_is_applied_once():
    """restore_rng sets the saved streams, then is a no-op (the loop may reach a second candidate point)."""
    from taskfit.seed import rng_states

    torch.manual_seed(3)
    random.seed(3)
    saved = {**_saved(), "rng": rng_states()}
    expected = (torch.rand(2), random.random())
    ts = TrainingState(FitState(), FitControl(), LossSums())
    ts.load_state_dict(saved)
    ts.restore_rng()
    assert torch.equal(torch.rand(2), expected[0]) and random.random() == expected[1]
    after = torch.get_rng_state()
    ts.restore_rng()
    assert torch.equal(torch.get_rng_state(), after) and ts.rng is None
