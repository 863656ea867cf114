"""F-LIT-6: ModelCheckpoint, LearningRateMonitor and EarlyStopping with Lightning's arguments, checked by values;
Lightning itself is the oracle for the learning-rate series and the stopping epoch."""

from __future__ import annotations

import math
import os

import pytest
import torch
from helpers.models import Regression
from taskfit import Fit, TaskModule
from taskfit.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# a validation metric that does not depend on training: both frameworks see the same sequence per epoch
VAL_SEQUENCE = [5.0, 3.0, 4.0, 2.0, 2.5, 2.6, 2.7, 1.0, 0.5, 0.4]


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1, keepdim=True))


class Scripted(Regression):
    """The canonical regression (3 features, seed 0) whose validation logs ``score`` = VAL_SEQUENCE[epoch] (and
    returns the MSE), with two parameter groups and an optional StepLR schedule."""

    def __init__(self, schedule: bool = False) -> None:
        super().__init__(features=3, seed=0)
        self.schedule = schedule

    def validation_step(self, batch, batch_idx):
        self.log("score", torch.tensor(VAL_SEQUENCE[self.fit.state.current_epoch]))
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        opt = torch.optim.SGD([{"params": [self.layer.weight]}, {"params": [self.layer.bias], "lr": 0.05}],
                              lr=0.1, momentum=0.9)
        if not self.schedule:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(tmp_path, callbacks, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8, "eval_strategy": "epoch",
            "logging_steps": 1}
    opts.update(kwargs)
    return Fit(callbacks=callbacks, **opts)


def _lightning_module(schedule: bool):
    import lightning.pytorch as pl

    class LitScripted(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("score", torch.tensor(VAL_SEQUENCE[self.current_epoch]))

        configure_optimizers = Scripted.configure_optimizers

    m = LitScripted()
    m.schedule = schedule
    return m


def _lightning_trainer(tmp_path, callbacks, epochs: int):
    import lightning.pytorch as pl

    from lightning.pytorch.loggers import CSVLogger

    return pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=CSVLogger(str(tmp_path)), enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      log_every_n_steps=1, default_root_dir=str(tmp_path), accelerator="cpu", devices=1)


# ------------------------------------------------------------------------------------------ ModelCheckpoint ---
def test_model_checkpoint_keeps_exactly_the_two_best_folders_F_LIT_6(tmp_path):
    ck = ModelCheckpoint(monitor="score", mode="min", save_top_k=2, save_last=True, filename="{epoch}-{score:.1f}")
    fit = _fit(tmp_path, [ck], num_train_epochs=6)
    fit.fit(Scripted(), _data(), _data())
    # scores by epoch: 5, 3, 4, 2, 2.5, 2.6 -> the two lowest are epoch 3 (2.0) and epoch 4 (2.5)
    assert sorted(os.listdir(ck.dirpath)) == ["epoch=3-score=2.0", "epoch=4-score=2.5", "last"]
    assert ck.best_model_path == os.path.join(ck.dirpath, "epoch=3-score=2.0")
    assert ck.best_model_score == pytest.approx(2.0)
    assert ck.last_model_path == os.path.join(ck.dirpath, "last")
    assert sorted(ck.best_k_models.values()) == [2.0, 2.5]
    state = ck.state_dict()
    assert state["best_model_path"] == ck.best_model_path and state["best_model_score"] == 2.0
    for name in ("epoch=3-score=2.0", "last"):  # normal checkpoint folders: manifest and weights
        assert os.path.exists(os.path.join(ck.dirpath, name, "manifest.json"))


def test_model_checkpoint_folder_resumes_exactly_F_LIT_6(tmp_path):
    """A ModelCheckpoint folder taken every 3 steps resumes to the same final weights as an uninterrupted run."""
    ck = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=3, save_top_k=-1)
    full = _fit(tmp_path / "a", [ck], num_train_epochs=3, eval_strategy="no")
    m_full = Scripted(schedule=True)
    full.fit(m_full, _data())
    names = sorted(os.listdir(ck.dirpath))
    assert names == sorted(["epoch=0-step=3", "epoch=1-step=6", "epoch=2-step=9", "epoch=2-step=12"])
    resumed = _fit(tmp_path / "b", [], num_train_epochs=3, eval_strategy="no")
    m_res = Scripted(schedule=True)
    resumed.fit(m_res, _data(), resume_from_checkpoint=os.path.join(ck.dirpath, "epoch=1-step=6"))
    assert resumed.state.global_step == 12
    for a, b in zip(m_full.parameters(), m_res.parameters()):
        assert torch.equal(a, b)


def test_model_checkpoint_bad_arguments_F_LIT_6():
    with pytest.raises(ValueError, match="mode='best'"):
        ModelCheckpoint(mode="best")
    with pytest.raises(ValueError, match="needs a monitor"):
        ModelCheckpoint(save_top_k=3)
    with pytest.raises(ValueError, match="mutually exclusive"):
        ModelCheckpoint(every_n_train_steps=2, every_n_epochs=1)


# -------------------------------------------------------------------------------------- LearningRateMonitor ---
def test_lr_monitor_series_equal_lightnings_F_LIT_6(tmp_path):
    from lightning.pytorch.callbacks import LearningRateMonitor as LitLRMonitor

    ours = LearningRateMonitor(logging_interval="step", log_momentum=True)
    fit = _fit(tmp_path / "t", [ours], num_train_epochs=3, eval_strategy="no")
    fit.fit(Scripted(schedule=True), _data())
    theirs = LitLRMonitor(logging_interval="step", log_momentum=True)
    trainer = _lightning_trainer(tmp_path / "l", [theirs], epochs=3)
    trainer.fit(_lightning_module(True), DataLoader(_data(), batch_size=8))
    assert set(ours.lrs) == set(theirs.lrs) == {"lr-SGD/pg1", "lr-SGD/pg2"}
    for name in theirs.lrs:
        assert len(ours.lrs[name]) == 12
        assert ours.lrs[name] == pytest.approx(theirs.lrs[name])
    assert ours.lrs["lr-SGD/pg1"][:4] == pytest.approx([0.1, 0.1, 0.1, 0.05])
    assert ours.last_momentum_values == pytest.approx(theirs.last_momentum_values)


# ------------------------------------------------------------------------------------------- EarlyStopping ---
@pytest.mark.parametrize("kwargs", [
    {"patience": 2},
    {"patience": 3, "min_delta": 0.6},
    {"patience": 5, "stopping_threshold": 2.2},
    {"patience": 5, "divergence_threshold": 4.5},
])
def test_early_stopping_stops_at_lightnings_epoch_F_LIT_6(tmp_path, kwargs):
    from lightning.pytorch.callbacks import EarlyStopping as LitEarlyStopping

    ours = EarlyStopping(monitor="score", mode="min", **kwargs)
    fit = _fit(tmp_path / "t", [ours], num_train_epochs=len(VAL_SEQUENCE))
    fit.fit(Scripted(), _data(), _data())
    theirs = LitEarlyStopping(monitor="score", mode="min", **kwargs)
    trainer = _lightning_trainer(tmp_path / "l", [theirs], epochs=len(VAL_SEQUENCE))
    trainer.fit(_lightning_module(False), DataLoader(_data(), batch_size=8), DataLoader(_data(), batch_size=8))
    # Lightning's stopped_epoch is the 0-based epoch it stopped in; ours is the fractional epoch count then
    assert trainer.current_epoch < len(VAL_SEQUENCE)  # Lightning did stop early
    assert math.ceil(ours.stopped_epoch) - 1 == theirs.stopped_epoch
    assert fit.state.current_epoch == trainer.current_epoch - 1


def test_early_stopping_not_strict_skips_a_missing_metric_F_LIT_6(tmp_path):
    es = EarlyStopping(monitor="absent", strict=False, patience=1)
    fit = _fit(tmp_path, [es], num_train_epochs=3)
    fit.fit(Scripted(), _data(), _data())
    assert fit.state.global_step == 12 and es.stopped_epoch is None
    with pytest.raises(KeyError, match="absent"):
        _fit(tmp_path / "s", [EarlyStopping(monitor="absent")], num_train_epochs=1).fit(Scripted(), _data(), _data())


# ----------------------------------------------------------------------------- ckpt_path="best"|"last"|path ---
def test_validate_test_predict_score_the_checkpoint_named_by_ckpt_path_F_LIT_6(tmp_path):
    ck = ModelCheckpoint(monitor="score", mode="min", save_top_k=1, save_last=True)
    fit = _fit(tmp_path, [ck], num_train_epochs=5)
    module = Scripted()
    fit.fit(module, _data(), _data())
    assert os.path.basename(ck.best_model_path) == "epoch=3-step=16"  # scores 5, 3, 4, 2, 2.5 -> epoch 3

    def weights_of(path):
        fresh = Scripted()
        fit.strategy.load_checkpoint(path, fresh)
        return [p.detach().clone() for p in fresh.parameters()]

    best_w, last_w = weights_of(ck.best_model_path), weights_of(ck.last_model_path)
    assert not torch.equal(best_w[0], last_w[0])
    for name, expected in (("best", best_w), ("last", last_w), (ck.best_model_path, best_w)):
        m = Scripted()
        out = fit.test(m, _data(), ckpt_path=name)
        for a, b in zip(m.parameters(), expected):
            assert torch.equal(a.detach(), b)
        x, y = _data()[:]
        expected_loss = nn.functional.mse_loss(x @ expected[0].T + expected[1], y).item()
        assert out["test_loss"] == pytest.approx(expected_loss, rel=1e-5)
    preds = fit.predict(Scripted(), _data(), ckpt_path="best")
    x = _data()[:][0]
    torch.testing.assert_close(torch.as_tensor(preds.predictions), (x @ best_w[0].T + best_w[1]).detach())
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        fit.validate(Scripted(), _data(), ckpt_path=str(tmp_path / "nowhere"))


# -------------------------------------------------------------------------------------- Timer, ModelSummary ---
def test_timer_stops_after_the_budget_with_a_checkpoint_F_LIT_6(tmp_path):
    from taskfit.callbacks import Timer
    from taskfit.callbacks.timer import parse_duration

    assert parse_duration("00:12:00:00") == 12 * 3600 and parse_duration({"minutes": 2}) == 120
    with pytest.raises(ValueError, match="DD:HH:MM:SS"):
        Timer(duration="12h")
    timer = Timer(duration=0)
    fit = _fit(tmp_path, [timer], num_train_epochs=3, eval_strategy="no")
    fit.fit(Scripted(), _data())
    assert fit.state.global_step == 1 and timer.stopped_step == 1
    assert os.path.exists(tmp_path / "checkpoint-1" / "manifest.json")
    assert timer.time_elapsed() > 0 and timer.time_remaining() < 0
    restored = Timer(duration=100)
    restored.load_state_dict(timer.state_dict())
    assert restored.time_elapsed() == pytest.approx(timer.time_elapsed())
    long = Timer(duration="00:01:00:00")
    fit2 = _fit(tmp_path / "long", [long], num_train_epochs=3, eval_strategy="no")
    fit2.fit(Scripted(), _data())
    assert fit2.state.global_step == 12 and long.stopped_step is None


def test_model_summary_rows_equal_lightnings_F_LIT_6(tmp_path, capsys):
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_summary import ModelSummary as LitSummary
    from taskfit.callbacks import ModelSummary

    def net(base):  # the same module on either base
        class Net(base):
            def __init__(self):
                super().__init__()
                self.encoder = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4))
                self.head = nn.Linear(4, 1)
                self.head.bias.requires_grad_(False)
                self.example_input_array = torch.zeros(5, 3)

            def forward(self, x):
                return self.head(self.encoder(x))

            def training_step(self, batch, batch_idx):
                return nn.functional.mse_loss(self(batch[0]), batch[1])
        return Net

    Net, LitNet = net(TaskModule), net(pl.LightningModule)

    for depth in (1, 2):
        cb = ModelSummary(max_depth=depth)
        _fit(tmp_path / str(depth), [cb], max_steps=1, eval_strategy="no").fit(Net(), _data())
        lit = LitSummary(LitNet(), max_depth=depth)
        assert [r["name"] for r in cb.rows] == lit.layer_names
        assert [r["type"] for r in cb.rows] == lit.layer_types
        assert [r["params"] for r in cb.rows] == lit.param_nums
        assert [r["in_shape"] for r in cb.rows] == lit.in_sizes
        assert [r["out_shape"] for r in cb.rows] == lit.out_sizes
        assert (cb.total_params, cb.trainable_params) == (lit.total_parameters, lit.trainable_parameters)
    assert "Trainable params" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ weight averaging ---
def test_ema_weights_equal_lightnings_and_are_what_save_model_writes_F_LIT_6(tmp_path):
    from lightning.pytorch.callbacks import EMAWeightAveraging as LitEMA
    from safetensors.torch import load_file
    from taskfit.callbacks import EMAWeightAveraging

    ours = EMAWeightAveraging(decay=0.8)
    fit = _fit(tmp_path / "t", [ours], num_train_epochs=4, eval_strategy="no", per_device_train_batch_size=32,
               max_grad_norm=0)
    m = Scripted(schedule=True)
    fit.fit(m, _data())
    lit = _lightning_module(True)
    _lightning_trainer(tmp_path / "l", [LitEMA(decay=0.8)], epochs=4).fit(lit, DataLoader(_data(), batch_size=32))
    for a, b in zip(m.parameters(), lit.parameters()):  # one batch per step: the order of samples cannot matter
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    fit.save_model(str(tmp_path / "export"))
    saved = load_file(str(tmp_path / "export" / "model.safetensors"))
    torch.testing.assert_close(saved["layer.weight"], m.layer.weight.detach())


def test_ema_resume_continues_the_average_exactly_F_LIT_6(tmp_path):
    from taskfit.callbacks import EMAWeightAveraging

    full = Scripted(schedule=True)
    _fit(tmp_path / "a", [EMAWeightAveraging(decay=0.7)], num_train_epochs=3, eval_strategy="no",
         save_strategy="steps", save_steps=5).fit(full, _data())
    resumed = Scripted(schedule=True)
    _fit(tmp_path / "b", [EMAWeightAveraging(decay=0.7)], num_train_epochs=3, eval_strategy="no").fit(
        resumed, _data(), resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-5"))
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    plain = Scripted(schedule=True)
    _fit(tmp_path / "c", [], num_train_epochs=3, eval_strategy="no").fit(plain, _data())
    assert not torch.equal(plain.layer.weight, full.layer.weight)  # the average is not the last weights
