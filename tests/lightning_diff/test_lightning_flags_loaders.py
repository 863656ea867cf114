"""Loaders under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``: when the train and validation loaders'
worker processes shut down (at the pass after ``current_epoch`` advanced, at the end of training, after an error),
what ``overfit_batches`` reads, several train loaders and ``CombinedLoader`` (F-LIT-DOOR-FLAGS)."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from harness import linear, regression
from two_doors import frameworks


class _Boom(Exception):
    pass


def _recording_loader(trainer_of, dataset, persistent):
    """A DataLoader (one worker) recording ``trainer.current_epoch`` at each worker shutdown."""
    class Iter(_MultiProcessingDataLoaderIter):
        def __init__(self, loader):
            super().__init__(loader)
            self.owner = loader

        def _shutdown_workers(self):
            self.owner.shutdowns.append(trainer_of().current_epoch)
            super()._shutdown_workers()

    class Loader(DataLoader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shutdowns = []

        def _get_iterator(self):
            return super()._get_iterator() if self.num_workers == 0 else Iter(self)

    return Loader(dataset, batch_size=4, num_workers=1, persistent_workers=persistent)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("fail", [False, True])
def test_F_LIT_DOOR_FLAGS_train_workers_shut_down_like_lightning(persistent, fail, tmp_path):
    """Worker shutdowns of the train and validation loaders happen at the same ``current_epoch`` values: a limited
    pass's workers when the next pass starts (not when its batches run out; the sanity check's at the first
    validation), the last at the end of training or after an exception in ``on_train_epoch_end``; a
    persistent-workers loader's at the end only."""
    got = {}
    for name, L in frameworks().items():
        holder = {}

        class Raise(L.Callback):
            def on_train_epoch_end(self, trainer, *_):
                if fail and trainer.current_epoch == 1:
                    raise _Boom

        class M(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx):
                pass

        trainer = holder["t"] = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=3,
                                          limit_train_batches=2, limit_val_batches=2, logger=False,
                                          enable_checkpointing=False, enable_progress_bar=False,
                                          enable_model_summary=False, callbacks=[Raise()])
        train = _recording_loader(lambda: holder["t"], regression(32), persistent)
        val = _recording_loader(lambda: holder["t"], regression(32), persistent)
        if fail:
            with pytest.raises(_Boom):
                trainer.fit(M(), train, val)
        else:
            trainer.fit(M(), train, val)
        got[name] = (list(train.shutdowns), list(val.shutdowns))
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][0] and got["taskfit"][1]


class _InOrder(Sampler):
    def __init__(self, data):
        self.data = data

    def __iter__(self):
        return iter(range(len(self.data)))

    def __len__(self):
        return len(self.data)


def test_F_LIT_DOOR_FLAGS_overfit_batches_reads_in_order_and_the_same_batch(tmp_path):
    """``overfit_batches``: a loader whose sampler is not a ``SequentialSampler`` is rebuilt with one, with
    Lightning's warning; with the sanity check, the validation loader is built inside an isolated random state,
    so a module building both loaders from random data trains on the batch it validates on."""
    got = {}
    for name, L in frameworks().items():
        seen = {"train": [], "val": []}

        class M(linear(L.LightningModule)):
            def train_dataloader(self):
                ds = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
                return DataLoader(ds, batch_size=4, sampler=_InOrder(ds))

            def val_dataloader(self):
                return self.train_dataloader()

            def training_step(self, batch, batch_idx):
                seen["train"].append(batch[0].clone())
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                seen["val"].append(batch[0].clone())

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=2, overfit_batches=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(M())
        warned = sorted(str(w.message) for w in caught if "requested to overfit" in str(w.message))
        got[name] = (warned, type(trainer.train_dataloader.sampler).__name__,
                     type(trainer.val_dataloaders.sampler).__name__, len(seen["train"]), len(seen["val"]),
                     torch.equal(seen["train"][0], seen["val"][0]),
                     all(torch.equal(t, seen["train"][0]) for t in seen["train"]))
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][5] is True and len(got["taskfit"][0]) == 2


@pytest.mark.parametrize("kind", ["list", "dict", "combined_min_size"])
def test_F_LIT_DOOR_FLAGS_several_train_loaders(kind, tmp_path):
    """A ``train_dataloader`` returning a list or dict of loaders trains on one batch of each per step (Lightning's
    ``CombinedLoader`` "max_size_cycle": the longest loader sets the epoch, the shorter one starts over); a
    ``CombinedLoader`` given as is keeps its mode. The same batches, steps and weights under both Trainers."""
    got, weights = {}, {}
    for name, L in frameworks().items():
        if name == "lightning":
            from lightning.pytorch.utilities import CombinedLoader
        else:
            from taskfit.lightning.utilities import CombinedLoader
        seen = []

        class M(linear(L.LightningModule)):
            def train_dataloader(self):
                a = DataLoader(regression(12, seed=1), batch_size=4)
                b = DataLoader(regression(8, seed=2), batch_size=4)
                if kind == "list":
                    return [a, b]
                if kind == "dict":
                    return {"a": a, "b": b}
                return CombinedLoader({"a": a, "b": b}, "min_size")

            def training_step(self, batch, batch_idx):
                parts = list(batch.values()) if isinstance(batch, dict) else list(batch)
                seen.append((batch_idx, sorted(batch) if isinstance(batch, dict) else len(batch),
                             [round(float(p[0].sum()), 4) for p in parts]))
                x = torch.cat([p[0] for p in parts])
                y = torch.cat([p[1] for p in parts])
                return torch.nn.functional.mse_loss(self.layer(x), y)

        torch.manual_seed(0)
        model = M()
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(model)
        got[name] = (seen, trainer.global_step, trainer.num_training_batches)
        weights[name] = [p.detach().clone() for p in model.parameters()]
    assert got["taskfit"] == got["lightning"]
    assert all(torch.equal(a, b) for a, b in zip(weights["taskfit"], weights["lightning"]))


@pytest.mark.parametrize("mode", ["min_size", "max_size_cycle", "max_size", "sequential"])
@pytest.mark.parametrize("shape", ["list", "dict"])
def test_F_LIT_DOOR_FLAGS_combined_loader_modes(mode, shape):
    """``CombinedLoader`` yields the same ``(batch, batch_idx, dataloader_idx)`` and length as Lightning's in its
    four modes; an unknown mode raises with Lightning's message."""
    from lightning.pytorch.utilities import CombinedLoader as Theirs

    from taskfit.lightning.utilities import CombinedLoader as Ours

    def make():
        a, b = [0, 1, 2, 3, 4], ["x", "y"]
        return [a, b] if shape == "list" else {"a": a, "b": b}

    ours, theirs = Ours(make(), mode), Theirs(make(), mode)
    iter(theirs)  # Lightning computes its length once iterated
    assert len(ours) == len(theirs)
    assert list(ours) == list(theirs)
    with pytest.raises(ValueError) as a:
        Ours([], "nope")
    with pytest.raises(ValueError) as b:
        Theirs([], "nope")
    assert str(a.value) == str(b.value)
