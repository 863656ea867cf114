"""F-LIT-7: Lightning's debugging switches as FitArguments options, checked by counts (Lightning is the oracle for
the batches limit_train_batches runs)."""

from __future__ import annotations

import os

import pytest
import torch
from helpers.models import Regression
from taskfit import Fit, FitArguments
from taskfit.callbacks import ModelCheckpoint
from taskfit.loops.finite import NonFiniteError
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1, keepdim=True))


class Counting(Regression):
    """The canonical regression (3 features, seed 0) recording every training / validation / test batch it sees
    (first input value)."""

    def __init__(self) -> None:
        super().__init__(features=3, seed=0)
        self.seen: list[tuple[str, float, bool]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(("train", float(batch[0][0, 0]), False))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.seen.append(("val", float(batch[0][0, 0]), self.fit.sanity_checking))
        return super().validation_step(batch, batch_idx)  # logs val_loss

    def test_step(self, batch, batch_idx):
        self.seen.append(("test", float(batch[0][0, 0]), False))
        return super().training_step(batch, batch_idx)

    def count(self, kind: str) -> int:
        return sum(1 for k, *_ in self.seen if k == kind)


def _fit(tmp_path, callbacks=(), **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2, "num_train_epochs": 2}
    opts.update(kwargs)
    return Fit(callbacks=list(callbacks), **opts)


@pytest.mark.parametrize("limit, per_epoch", [(0.25, 4), (3, 3), (1.0, 16), (100, 16)])
def test_limit_train_batches_runs_that_many_per_epoch_F_LIT_7(tmp_path, limit, per_epoch):
    m = Counting()
    fit = _fit(tmp_path, limit_train_batches=limit)
    fit.fit(m, _data())
    assert m.count("train") == 2 * per_epoch
    assert fit.state.global_step == 2 * per_epoch


def test_limit_train_batches_equals_lightnings_count_F_LIT_7(tmp_path):
    import lightning.pytorch as pl

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 1)
            self.calls = 0

        def training_step(self, batch, batch_idx):
            self.calls += 1
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    for limit in (0.25, 0.3, 5):
        lit = Lit()
        pl.Trainer(max_epochs=2, limit_train_batches=limit, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                   default_root_dir=str(tmp_path)).fit(lit, DataLoader(_data(), batch_size=2))
        m = Counting()
        _fit(tmp_path / str(limit), limit_train_batches=limit).fit(m, _data())
        assert m.count("train") == lit.calls


def test_limit_val_and_test_batches_F_LIT_7(tmp_path):
    m = Counting()
    fit = _fit(tmp_path, eval_strategy="epoch", limit_val_batches=0.5, limit_test_batches=3)
    fit.fit(m, _data(), _data(16))
    assert m.count("val") == 2 * 4  # 8 eval batches, half of them, each of the 2 epochs
    fit.test(m, _data())
    assert m.count("test") == 3


def test_fast_dev_run_one_batch_no_checkpoints_no_logs_F_LIT_7(tmp_path):
    m = Counting()
    ck = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=1)
    fit = _fit(tmp_path, [ck], fast_dev_run=True, eval_strategy="epoch", save_strategy="steps", save_steps=1,
               report_to="csv", num_train_epochs=5)
    fit.fit(m, _data(), _data())
    assert (m.count("train"), m.count("val")) == (1, 1)
    assert fit.state.global_step == 1
    assert not os.path.exists(tmp_path / "ck")
    assert not [n for n in os.listdir(tmp_path) if n.startswith("checkpoint-")]
    csv_rows = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".csv")]
    assert all(os.path.getsize(p) == 0 for p in csv_rows)
    m3 = Counting()
    _fit(tmp_path / "n", fast_dev_run=3, eval_strategy="epoch").fit(m3, _data(), _data())
    assert (m3.count("train"), m3.count("val")) == (3, 3)


def test_overfit_batches_repeats_the_same_unshuffled_batches_F_LIT_7(tmp_path):
    m = Counting()
    _fit(tmp_path, overfit_batches=2, num_train_epochs=3).fit(m, _data())
    train = [v for k, v, _ in m.seen if k == "train"]
    x = _data()[:][0]
    assert train == [float(x[0, 0]), float(x[2, 0])] * 3  # the first two batches, in order, every epoch


def test_num_sanity_val_steps_runs_before_training_unlogged_F_LIT_7(tmp_path):
    m = Counting()
    fit = _fit(tmp_path, num_sanity_val_steps=2, eval_strategy="epoch", num_train_epochs=1)
    fit.fit(m, _data(), _data())
    assert [k for k, _, sanity in m.seen[:3]] == ["val", "val", "train"]
    assert [s for _, _, s in m.seen[:2]] == [True, True]
    assert m.count("val") == 2 + 16
    assert len([r for r in fit.state.log_history if "eval_loss" in r]) == 1  # the sanity pass is not logged


def test_detect_anomaly_names_the_op_making_nan_F_LIT_7(tmp_path):
    class NaNGrad(Counting):
        def training_step(self, batch, batch_idx):
            z = self.layer(batch[0])
            return torch.sqrt(z - z).sum()  # d sqrt(0) = inf, times 0 = NaN in backward

    with pytest.raises(RuntimeError, match="returned nan values"):
        _fit(tmp_path, detect_anomaly=True).fit(NaNGrad(), _data())
    with pytest.raises(NonFiniteError):  # without the switch the NaN is found at the end of fit, not at the op
        _fit(tmp_path / "off").fit(NaNGrad(), _data())


def test_gradient_clip_by_value_clamps_each_element_F_LIT_7(tmp_path):
    data = _data(2)
    m = Counting()
    before = [p.detach().clone() for p in m.parameters()]
    loss = nn.functional.mse_loss(m.layer(data[:][0]), data[:][1])
    grads = torch.autograd.grad(loss, list(m.parameters()))
    fit = _fit(tmp_path, max_grad_norm=0.05, gradient_clip_algorithm="value", optim="sgd", learning_rate=1.0,
               max_steps=1, lr_scheduler_type="constant")
    fit.fit(m, data)
    assert any((g.abs() > 0.05).any() for g in grads)  # the clip really bites
    for b, g, p in zip(before, grads, m.parameters()):
        torch.testing.assert_close(p.detach(), b - g.clamp(-0.05, 0.05))


def test_bad_switch_values_are_refused_before_any_work_F_LIT_7():
    with pytest.raises(ValueError, match="limit_train_batches=1.5"):
        FitArguments(limit_train_batches=1.5)
    with pytest.raises(ValueError, match="gradient_clip_algorithm='l2'"):
        FitArguments(gradient_clip_algorithm="l2")
    with pytest.raises(ValueError, match="num_sanity_val_steps=-2"):
        FitArguments(num_sanity_val_steps=-2)
    with pytest.raises(ValueError, match="leaves none"):
        Fit(FitArguments(limit_train_batches=0.01, report_to="none", disable_tqdm=True)).fit(Counting(), _data())


def test_switches_parse_from_config_text_F_LIT_7():
    """YAML / CLI values arrive as text: counts stay ints, fractions floats, fast_dev_run a bool or a count."""
    a = FitArguments(limit_train_batches="0.25", limit_val_batches="3", fast_dev_run="true", detect_anomaly="1")
    assert (a.limit_train_batches, a.limit_val_batches, a.fast_dev_run, a.detect_anomaly) == (0.25, 3, True, True)
    assert isinstance(a.limit_val_batches, int) and FitArguments(fast_dev_run="4").fast_dev_run == 4
