"""``Fit`` composed, not stacked (F-CORE-3): the current run is public and read-only (``fit.run``), a checkpoint is
written through the public ``Fit.save_checkpoint`` (Lightning's ``Trainer.save_checkpoint``) and reads back into a
resumed run, and ``Fit``/``Run`` satisfy the ``FitView``/``RunView`` protocols helpers are typed against."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.models import Classifier
from taskfit import Callback, Fit, FitArguments
from taskfit.protocols import FitView, RunView
from torch.utils.data import TensorDataset


def _data(n=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no", seed=3,
                per_device_train_batch_size=8, max_steps=6, learning_rate=0.1, logging_steps=2)
    base.update(kw)
    return FitArguments(**base)


class _Seen(Callback):
    def __init__(self):
        self.runs = {}

    def on_train_start(self, fit, module):
        self.runs["train"] = (fit.run, fit.run.stage, isinstance(fit.run, RunView))

    def on_validation_start(self, fit, module):
        self.runs.setdefault("validate", (fit.run, fit.run.stage))


def test_F_CORE_3_fit_run_is_the_call_in_progress_and_none_outside(tmp_path):
    seen = _Seen()
    fit = Fit(_args(tmp_path), accelerator="cpu", callbacks=[seen])
    assert fit.run is None and isinstance(fit, FitView)
    torch.manual_seed(0)
    fit.fit(Classifier(features=4, classes=2, seed=None), _data())
    run, stage, is_view = seen.runs["train"]
    assert stage == "fit" and is_view and run.optimizers and run.training_state is not None
    assert fit.run is None  # read-only view of the call in progress
    with pytest.raises(AttributeError):
        fit.run = run
    fit.validate(data=_data(16))
    assert seen.runs["validate"][1] == "validate" and seen.runs["validate"][0] is not run
    assert fit.run is None and fit.optimizer is run.optimizer  # the last fit's objects stay readable


class _SaveAt(Callback):
    def __init__(self, folder):
        self.folder, self.written = folder, None

    def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
        if fit.state.global_step == 3 and self.written is None:
            self.written = fit.save_checkpoint(self.folder)


def test_F_CKPT_2_public_save_checkpoint_writes_a_folder_a_run_resumes_from(tmp_path):
    folder = str(tmp_path / "mid")
    saver = _SaveAt(folder)
    torch.manual_seed(0)
    full = Fit(_args(tmp_path / "a"), accelerator="cpu", callbacks=[saver])
    full.fit(Classifier(features=4, classes=2, seed=None), _data())
    assert saver.written == folder and os.path.isdir(folder)
    torch.manual_seed(0)
    resumed = Fit(_args(tmp_path / "b"), accelerator="cpu")
    out = resumed.fit(Classifier(features=4, classes=2, seed=None), _data(), resume_from_checkpoint=folder)
    assert out.global_step == 6
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)  # resumed from the public save: the same end as the run that never stopped
    after = full.save_checkpoint(str(tmp_path / "after"))  # Lightning: also after fit
    assert os.path.isdir(after)


def test_F_CORE_3_save_checkpoint_before_any_fit_names_the_problem(tmp_path):
    with pytest.raises(RuntimeError, match="needs a training run"):
        Fit(_args(tmp_path), accelerator="cpu").save_checkpoint(str(tmp_path / "x"))


def test_F_CORE_3_fit_has_no_mixin_bases():
    assert len(Fit.__bases__) == 1 and Fit.__bases__[0].__name__ == "Topology"
