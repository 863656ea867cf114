"""F-LIT-7: profilers as an option and as objects: the simple profiler's summary lists training_step with a positive
total and one call per micro-batch; cProfile tables per action; a torch.profiler Chrome trace of a step window."""

from __future__ import annotations

import json
import os

import pytest
from helpers.models import Regression, regression_data
from taskfit import Fit, FitArguments
from taskfit.callbacks.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler


def _fit(tmp_path, **kw):
    return Fit(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=8,
               report_to="none", disable_tqdm=True, save_strategy="no", num_train_epochs=2, **kw)


def test_simple_profiler_option_counts_every_action_F_LIT_7(tmp_path):
    fit = _fit(tmp_path, profiler="simple", gradient_accumulation_steps=2, eval_strategy="epoch")
    fit.fit(Regression(seed=None), regression_data(32), regression_data(16))
    prof = [cb for cb in fit.callbacks if isinstance(cb, SimpleProfiler)][0]
    d = prof.recorded_durations
    assert len(d["training_step"]) == len(d["backward"]) == len(d["training_batch"]) == 16  # 8 batches x 2 epochs
    assert len(d["optimizer_step"]) == 8  # one per window of 2
    assert len(d["validation_step"]) == 2 * 2
    assert sum(d["training_step"]) > 0
    text = (tmp_path / "fit-profile-fit.txt").read_text()
    assert "training_step" in text and text == prof.summary()


def test_no_profiler_adds_no_callback_F_LIT_7(tmp_path):
    fit = _fit(tmp_path)
    assert not [cb for cb in fit.callbacks if type(cb).__module__ == "taskfit.callbacks.profilers"]
    with pytest.raises(ValueError, match="profiler='fast'"):
        FitArguments(profiler="fast")


def test_advanced_and_pytorch_profilers_as_objects_F_LIT_7(tmp_path):
    adv = AdvancedProfiler(filename="adv")
    torch_prof = PyTorchProfiler(skip_first=2, active=2)
    _fit(tmp_path, callbacks=[adv, torch_prof]).fit(Regression(seed=None), regression_data(32))
    assert "training_step" in adv.summary() and "Profile stats for: backward" in adv.summary()
    assert os.path.exists(tmp_path / "adv-fit.txt")
    assert torch_prof.trace_path is not None
    with open(torch_prof.trace_path) as f:
        trace = json.load(f)
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("addmm" in n or "linear" in n for n in names)  # the layer's matmul was recorded
    assert "aten::" in torch_prof.summary()
