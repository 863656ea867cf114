"""F-LOOP-6, F-CKPT-2: one restore point. A resume loads the progress (never the new run's plan), a checkpoint
taken after an epoch's end records the next epoch's start (older files that marked it with ``loop.epoch_done``
read the same), and the restored RNG states are applied once."""

import random

import torch

from taskfit.loops.state import FitControl, FitState, LossSums, TrainingState, plan_fields, upgrade_training_state


def _saved(**state):
    return {"version": 2, "state": FitState(**state).state_dict(), "control": {}, "precision": {}, "callbacks": {},
            "results": {}, "loop": {"tr_loss_per_rank": torch.tensor([1.5]), "steps_since_log": 1,
                                    "total_loss": 3.0, "epoch_done": False, "grad_norm": None}}


def test_F_LOOP_6_plan_fields_stay_the_new_runs():
    """The plan (step budget, intervals, batch layout, process) is the new run's; the progress is the saved one."""
    assert set(plan_fields()) == {"max_steps", "num_train_epochs", "batches_per_epoch", "logging_steps", "eval_steps",
                                  "save_steps", "train_batch_size", "is_local_process_zero", "is_world_process_zero"}
    saved = _saved(global_step=7, current_epoch=1, batch_in_epoch=3, max_steps=10, logging_steps=2,
                   batches_per_epoch=5, is_world_process_zero=True)
    state = FitState(max_steps=20, logging_steps=4, batches_per_epoch=9, is_world_process_zero=False)
    TrainingState(state, FitControl(), LossSums()).load_state_dict(saved)
    assert (state.global_step, state.current_epoch, state.batch_in_epoch) == (7, 1, 3)
    assert (state.max_steps, state.logging_steps, state.batches_per_epoch, state.is_world_process_zero) == (
        20, 4, 9, False)


def test_F_CKPT_2_epoch_end_checkpoint_is_the_next_epochs_start_in_every_version():
    """Version 3 writes the next epoch's start after an epoch's end; a version-2 file (epoch_done) reads the same."""
    state = FitState(global_step=6, current_epoch=1, batch_in_epoch=5)
    live = TrainingState(state, FitControl(), LossSums())
    live.epoch_ended = True
    new = live.state_dict()
    assert new["version"] == 3 and new["loop"]["epoch_done"] is False
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
