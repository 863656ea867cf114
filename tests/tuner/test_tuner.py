"""F-LIT-7: the learning-rate finder equals Lightning's on the same module, seed and data; the weights are the
same before and after; the plot is a PNG."""

from __future__ import annotations

import pytest
import torch
from helpers.models import LightningStyle
from taskfit import Fit
from taskfit.tuner.tuner import lr_find
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, 3 * x.sum(-1, keepdim=True) + 1)


def _reg() -> LightningStyle:
    """The canonical Lightning-style module: ``nn.Linear(3, 1)`` seeded with 0, plain SGD at lr 0.1."""
    return LightningStyle(features=3, lr=0.1, momentum=0.0, seed=0)


def test_lr_find_equals_lightnings_and_restores_the_weights_F_LIT_7(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    class LitReg(pl.LightningModule):  # the same module as _reg() written for Lightning
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = _reg()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    fit = Fit(output_dir=str(tmp_path / "t"), per_device_train_batch_size=32, max_grad_norm=0, report_to="none",
              disable_tqdm=True)
    ours = lr_find(fit, module, _data(), min_lr=1e-4, max_lr=10.0, num_training=60)
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k])
    assert fit.state.global_step == 0  # the Fit itself did not train

    trainer = pl.Trainer(max_epochs=1000, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1, default_root_dir=str(tmp_path))
    theirs = Tuner(trainer).lr_find(LitReg(), train_dataloaders=DataLoader(_data(), batch_size=32), min_lr=1e-4,
                                    max_lr=10.0, num_training=60, update_attr=False)
    n = len(theirs.results["lr"])
    assert 10 < n <= 60 and len(ours.results["lr"]) == n  # both stopped at the same divergence step
    assert ours.results["lr"] == pytest.approx(theirs.results["lr"])
    assert ours.results["loss"] == pytest.approx(theirs.results["loss"], rel=1e-4)
    assert ours.suggestion() == pytest.approx(theirs.suggestion())

    ours.plot(str(tmp_path / "lr.png"))
    assert (tmp_path / "lr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lr_find_bad_arguments_F_LIT_7(tmp_path):
    fit = Fit(output_dir=str(tmp_path), report_to="none", disable_tqdm=True)
    with pytest.raises(ValueError, match="min_lr < max_lr"):
        lr_find(fit, _reg(), _data(), min_lr=1.0, max_lr=0.1)
    with pytest.raises(ValueError, match="mode='cosine'"):
        lr_find(fit, _reg(), _data(), mode="cosine")


class MemoryBound(LightningStyle):
    """Runs out of memory above ``capacity`` samples per batch (as an allocator would) and records the sizes."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.tried = capacity, []

    def training_step(self, batch, batch_idx):
        n = len(batch[0])
        if batch_idx == 0:
            self.tried.append(n)
        if n > self.capacity:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("mode, capacity, expected, tried", [
    ("power", 20, 16, [2, 4, 8, 16, 32]),
    ("binsearch", 20, 20, [2, 4, 8, 16, 32, 24, 20, 22, 21]),
    ("power", 100, 64, [2, 4, 8, 16, 32, 64]),  # 64 holds the whole dataset: stop there
])
def test_scale_batch_size_finds_the_largest_that_fits_and_restores_F_LIT_7(tmp_path, mode, capacity, expected,
                                                                           tried):
    from taskfit.tuner.tuner import scale_batch_size

    module = MemoryBound(capacity)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    fit = Fit(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, dataloader_drop_last=True)
    assert scale_batch_size(fit, module, _data(64), mode=mode, steps_per_trial=1) == expected
    assert module.tried == tried
    assert fit.args.per_device_train_batch_size == expected
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k])
