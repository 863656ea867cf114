"""F-LIT-7: the LearningRateFinder and BatchSizeFinder callbacks find what ``taskfit.tuner.tuner`` finds on the same seed
(and, for the rate, what Lightning's callback suggests), put the weights, optimizer and random state back, and
the run then trains exactly as a plain run given the value found."""

from __future__ import annotations

import pytest
import torch
from helpers.models import LightningStyle
from taskfit import Fit
from taskfit.tuner import BatchSizeFinder, LearningRateFinder
from taskfit.tuner.tuner import lr_find, scale_batch_size
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FINDER = dict(min_lr=1e-4, max_lr=10.0, num_training_steps=30)


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, 3 * x.sum(-1, keepdim=True) + 1)


class Reg(LightningStyle):
    """The canonical Lightning-style module (3 features, seed 0, SGD at ``lr`` with momentum 0.9) with the
    ``batch_size`` attribute the batch-size finder scales, running out of memory above ``capacity`` samples."""

    def __init__(self, lr: float = 0.1, capacity: int = 10**9):
        super().__init__(features=3, lr=lr, momentum=0.9, seed=0)
        self.capacity, self.batch_size = capacity, 2

    def training_step(self, batch, batch_idx):
        if len(batch[0]) > self.capacity:  # as an allocator would
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().training_step(batch, batch_idx)


def _fit(tmp_path, callbacks=(), **kwargs) -> Fit:
    opts = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no",
                per_device_train_batch_size=32, num_train_epochs=3, max_grad_norm=0, logging_steps=1)
    opts.update(kwargs)
    return Fit(callbacks=list(callbacks), **opts)


def test_learning_rate_finder_callback_equals_lr_find_F_LIT_7(tmp_path):
    cb = LearningRateFinder(**FINDER)
    tuned = Reg()
    fit = _fit(tmp_path / "a", [cb], per_device_train_batch_size=4, num_train_epochs=1)  # shuffled batches
    fit.fit(tuned, _data())
    expected = lr_find(_fit(tmp_path / "b", per_device_train_batch_size=4), Reg(), _data(), min_lr=1e-4,
                       max_lr=10.0, num_training=30)
    lr = cb.optimal_lr.suggestion()
    assert lr == expected.suggestion() and cb.optimal_lr.results == expected.results
    assert tuned.lr == lr and fit.state.global_step == 8

    plain = Reg(lr=lr)  # the same run given the rate: weights, optimizer state and RNG were put back exactly
    _fit(tmp_path / "c", per_device_train_batch_size=4, num_train_epochs=1).fit(plain, _data())
    for a, b in zip(tuned.parameters(), plain.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_learning_rate_finder_callback_suggests_lightnings_rate_F_LIT_7(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LearningRateFinder as LitFinder

    cb = LearningRateFinder(**FINDER)
    tuned = Reg()
    _fit(tmp_path / "a", [cb]).fit(tuned, _data())
    lr = cb.optimal_lr.suggestion()

    class LitReg(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(3, 1)
            self.lr = 0.1

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    lit_cb = LitFinder(**FINDER)
    lit = LitReg()
    pl.Trainer(max_epochs=1000, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=str(tmp_path / "l"),
               callbacks=[lit_cb]).fit(lit, DataLoader(_data(), batch_size=32))
    assert lit_cb.optimal_lr.suggestion() == pytest.approx(lr)
    assert lit.lr == pytest.approx(lr)
    for a, b in zip(tuned.parameters(), lit.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)


def test_batch_size_finder_callback_equals_scale_batch_size_F_LIT_7(tmp_path):
    cb = BatchSizeFinder(mode="power", steps_per_trial=1, init_val=8)
    tuned = Reg(capacity=20)
    fit = _fit(tmp_path / "a", [cb], per_device_train_batch_size=8, dataloader_drop_last=True, num_train_epochs=2)
    fit.fit(tuned, _data(64))
    other = _fit(tmp_path / "b", per_device_train_batch_size=8, dataloader_drop_last=True)
    expected = scale_batch_size(other, Reg(capacity=20), _data(64), mode="power", steps_per_trial=1, init_val=8)
    assert cb.optimal_batch_size == expected == 16 and tuned.batch_size == 16
    assert fit.args.per_device_train_batch_size == 16
    assert fit.state.global_step == fit.state.max_steps == 2 * (64 // 16)  # trained with the size found

    plain = Reg(capacity=20)
    _fit(tmp_path / "c", per_device_train_batch_size=16, dataloader_drop_last=True, num_train_epochs=2).fit(
        plain, _data(64))
    for a, b in zip(tuned.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_finder_callbacks_bad_arguments_F_LIT_7(tmp_path):
    with pytest.raises(ValueError, match="mode='cosine'"):
        LearningRateFinder(mode="cosine")
    with pytest.raises(ValueError, match="steps_per_trial=0"):
        BatchSizeFinder(steps_per_trial=0)
    with pytest.raises(ValueError, match="max_steps=4"):
        _fit(tmp_path, [BatchSizeFinder()], max_steps=4).fit(Reg(), _data())
