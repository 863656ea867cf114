"""LightningDataModule and the trainer around it, the same script under ``lightning`` and ``taskfit.lightning``
(scenarios after Lightning's tests_pytorch/core/test_datamodules.py): ``from_datasets``, ``hparams``, ``str()``,
the datamodule's state in checkpoints, its hooks in the profiler, a step set to None, ``trainer.state``,
``deterministic="warn"`` (F-LIT-9)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from harness import linear, regression
from torch.nn import functional as F
from torch.utils.data import DataLoader


def _frameworks():
    import lightning
    import taskfit.lightning

    return {"lightning": lightning, "taskfit": taskfit.lightning}


def _callbacks(name):
    import importlib

    return importlib.import_module("lightning.pytorch.callbacks" if name == "lightning" else
                                   "taskfit.lightning.callbacks")


def _batches(loaders):
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    return [[torch.cat([t.flatten() for t in b]) for b in dl] for dl in loaders]


def test_F_LIT_9_from_datasets_hparams_and_str():
    """from_datasets: the same batches per stage (training shuffled from the same seed), batch_size/num_workers
    and extra kwargs passed to __init__; save_hyperparameters fills hparams; str() is Lightning's summary before
    and after the loaders exist."""
    seen = {}
    for name, L in _frameworks().items():
        class DM(L.LightningDataModule):
            def __init__(self, other, batch_size=1):
                super().__init__()
                self.save_hyperparameters()
                self.other = other

        torch.manual_seed(0)
        dm = DM.from_datasets(regression(8), [regression(6), regression(5)], batch_size=4, num_workers=0, other=5)
        seen[name] = (_batches(dm.train_dataloader()), _batches(dm.val_dataloader()), dict(dm.hparams), dm.other,
                      str(dm), str(L.LightningDataModule()))
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'other'"):
            DM.from_datasets(regression(8), batch_size=4)
    (lt, lv, *lrest), (tt, tv, *trest) = seen["lightning"], seen["taskfit"]
    assert all(torch.equal(a, b) for x, y in zip(lt + lv, tt + tv) for a, b in zip(x, y))
    assert trest == lrest
    assert trest[:3] == [{"other": 5, "batch_size": 4}, 5, os.linesep.join(
        ["{Train dataloader: size=8}", "{Validation dataloader: 1. size=6 ; 2. size=5}", "{Test dataloader: None}",
         "{Predict dataloader: None}"])]


def datamodule(L, record):
    class DM(L.LightningDataModule):
        def prepare_data(self):
            pass

        def train_dataloader(self):
            return DataLoader(regression(16), batch_size=4)

        def val_dataloader(self):
            return DataLoader(regression(8, seed=1), batch_size=4)

        def state_dict(self):
            return {"served": 3}

        def load_state_dict(self, state_dict):
            record.append(state_dict)
    return DM()


def validating(base):
    class M(linear(base)):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("step_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self.layer(x), y))
    return M


def _trainer(L, root, **flags):
    return L.Trainer(default_root_dir=str(root), logger=False, enable_progress_bar=False,
                     enable_model_summary=False, **flags)


def test_F_LIT_9_state_in_checkpoints_profiled_hooks_and_trainer_state(tmp_path):
    """ModelCheckpoint(dirpath=pathlib.Path) writes a checkpoint holding the datamodule's state_dict; resuming from
    it gives that state to load_state_dict; with profiler="simple" the datamodule's hooks are timed under
    Lightning's action names; trainer.state is finished (fn "fit"), the datamodule knows its trainer; weights
    equal."""
    seen = {}
    for name, L in _frameworks().items():
        record = []
        root = tmp_path / name
        torch.manual_seed(0)
        m, dm = validating(L.LightningModule)(), datamodule(L, record)
        ckpt = _callbacks(name).ModelCheckpoint(dirpath=Path(root / "ckpt"), save_last=True)
        trainer = _trainer(L, root, max_epochs=1, profiler="simple", callbacks=[ckpt], num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(m, datamodule=dm)
            state = (trainer.state.finished, trainer.state.fn.value, trainer.state.status.value,
                     dm.trainer is trainer)
            keys = sorted(k for k in trainer.profiler.recorded_durations if k.startswith("[LightningDataModule]"))
            again = _trainer(L, root, max_epochs=2, num_sanity_val_steps=0)
            again.fit(m, datamodule=dm, ckpt_path=ckpt.last_model_path)
        seen[name] = (state, [k.split(".")[-1] for k in keys], record, again.global_step,
                      [p.detach().clone() for p in m.parameters()])
    (ls, lk, lr, lg, lw), (ts, tk, tr, tg, tw) = seen["lightning"], seen["taskfit"]
    assert ts == ls == (True, "fit", "finished", True)
    assert tk == lk == ["prepare_data", "setup", "state_dict", "teardown", "train_dataloader", "val_dataloader"]
    assert tr == lr == [{"served": 3}]
    assert tg == lg == 8
    assert all(torch.equal(a, b) for a, b in zip(lw, tw))


@pytest.mark.parametrize("disabled", ["validation_step", "both"])
def test_F_LIT_9_step_set_to_none_means_no_loop(disabled, tmp_path):
    """``model.validation_step = None`` (and ``test_step``) with a datamodule that has a val_dataloader: fit trains
    without validating (no val_loss), as Lightning; same weights and logged loss."""
    seen = {}
    for name, L in _frameworks().items():
        torch.manual_seed(0)
        m = validating(L.LightningModule)()
        m.validation_step = None
        if disabled == "both":
            m.test_step = None
        trainer = _trainer(L, tmp_path / name, max_epochs=1, enable_checkpointing=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(m, datamodule=datamodule(L, []))
        seen[name] = ("val_loss" in trainer.callback_metrics, float(trainer.callback_metrics["step_loss"]),
                      trainer.state.finished, [p.detach().clone() for p in m.parameters()])
    (lk, ll, lf, lw), (tk, tl, tf, tw) = seen["lightning"], seen["taskfit"]
    assert tk is lk is False and tl == ll and tf is lf is True
    assert all(torch.equal(a, b) for a, b in zip(lw, tw))


def test_F_LIT_9_deterministic_warn_sets_only_the_cublas_workspace(monkeypatch, tmp_path):
    """Trainer(deterministic="warn") turns on deterministic algorithms in warn-only mode and sets
    CUBLAS_WORKSPACE_CONFIG, and leaves CUDA_LAUNCH_BLOCKING unset, as Lightning."""
    seen = {}
    try:
        for name, L in _frameworks().items():
            monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
            monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
            torch.use_deterministic_algorithms(False)
            _trainer(L, tmp_path / name, deterministic="warn")
            seen[name] = (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled(),
                          os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "CUDA_LAUNCH_BLOCKING" in os.environ)
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen["taskfit"] == seen["lightning"] == (True, True, ":4096:8", False)
