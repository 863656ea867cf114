"""F-LOOP-6, F-CKPT-2: a resume is "load, then continue": the run's plan (step budget, intervals) is the new run's,
never the checkpoint's. A run resumed under another ``max_steps`` trains to the new budget, its intervals follow
the new arguments, and ``trainer_state.json`` records the new plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from taskfit import Fit

sys.path.insert(0, str(Path(__file__).parent))
import job  # noqa: E402


def _fit(out: Path, steps: int, save_steps: int, logging_steps: int) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, max_steps=steps, save_steps=save_steps, logging_steps=logging_steps)


def test_F_LOOP_6_resumed_run_under_another_max_steps_uses_the_new_plan(tmp_path):
    torch.manual_seed(0)
    _fit(tmp_path / "a", 3, save_steps=2, logging_steps=1).fit(job.Net(), job.data())
    ck = tmp_path / "a" / "checkpoint-2"
    saved = torch.load(ck / "training_state.pt", weights_only=True)
    assert (saved["plan"]["max_steps"], saved["plan"]["logging_steps"]) == (3, 1)
    torch.manual_seed(0)
    fit = _fit(tmp_path / "b", 5, save_steps=5, logging_steps=2)
    fit.fit(job.Net(), job.data(), resume_from_checkpoint=str(ck))
    assert (fit.state.global_step, fit.state.max_steps, fit.state.logging_steps, fit.state.save_steps) == (5, 5, 2, 5)
    assert fit.run is None and fit.state.plan.max_steps == 5
    hf = json.loads((tmp_path / "b" / "checkpoint-5" / "trainer_state.json").read_text())
    assert (hf["max_steps"], hf["logging_steps"], hf["save_steps"], hf["global_step"]) == (5, 2, 5, 5)
    # steps 1-2 logged before the checkpoint; after it, the new interval (4 is the one multiple of 2 in 3..5)
    steps = [row["step"] for row in fit.state.log_history if "loss" in row]
    assert steps == [1, 2, 4]
