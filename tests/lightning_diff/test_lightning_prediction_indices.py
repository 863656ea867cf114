"""``BasePredictionWriter`` gets each batch's sample indices when the predictions come from the module's own
``predict_dataloader()`` (no loader given to ``predict``), as under Lightning: ``write_on_epoch_end``'s
``batch_indices`` and ``write_on_batch_end``'s equal Lightning's, in order, with and without a sampler."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from harness import linear, regression
from two_doors import callbacks_of, frameworks


def _loader(kind):
    ds = regression(6)
    if kind == "in_order":
        return DataLoader(ds, batch_size=4, shuffle=False)
    if kind == "list_sampler":
        return DataLoader(ds, batch_size=2, sampler=[5, 1, 4, 0, 2, 3])
    return DataLoader(ds, batch_size=4, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(1)))


def _predict(L, root, kind):
    got = {"batch": [], "epoch": None}

    class Writer(callbacks_of(L).BasePredictionWriter):
        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
            got["batch"].append((batch_idx, dataloader_idx, list(batch_indices)))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            got["epoch"] = ([[p.tolist() for p in ps] for ps in [predictions]], batch_indices)

    class M(linear(L.LightningModule)):
        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0]).squeeze(-1)

        def predict_dataloader(self):
            return _loader(kind)

    trainer = L.Trainer(default_root_dir=str(root), accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Writer(write_interval="batch_and_epoch")])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = trainer.predict(M())
    return got, [p.tolist() for p in out]


@pytest.mark.parametrize("kind", ["in_order", "list_sampler", "random_sampler"])
def test_F_LIT_PRED_module_loader_batch_indices_like_lightning(tmp_path, kind):
    """F-LIT-DOOR: the module's ``predict_dataloader()`` (in order, a list sampler, a seeded ``RandomSampler``):
    per-batch and epoch-end indices, predictions and returned outputs equal to Lightning's."""
    got = {name: _predict(L, tmp_path / name, kind) for name, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    (writer, _) = got["lightning"]
    assert writer["epoch"][1] and all(ix is not None for ix in writer["epoch"][1][0])
