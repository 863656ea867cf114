"""Lightning's hook calls around ``validate``/``test``/``predict`` and the datamodule's, judged by Lightning itself:
the same module, with every hook wrapped on the instance (as Lightning's own tests_pytorch/models/test_hooks.py
does), run by ``lightning.Trainer`` and by ``taskfit.lightning.Trainer``; the recorded calls (name, arguments'
kinds, keyword arguments) must be equal (F-LIT-DOOR-HOOKS)."""

import functools
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from harness import data, linear


def _frameworks():
    import lightning
    import taskfit.lightning

    return {"lightning": lightning, "taskfit": taskfit.lightning}


#: hooks both LightningModule and TaskModule define, plus the nn.Module calls Lightning's test records
HOOKS = ("configure_callbacks", "prepare_data", "setup", "configure_model", "teardown", "zero_grad", "train",
         "forward", "val_dataloader", "test_dataloader", "predict_dataloader", "on_before_batch_transfer",
         "transfer_batch_to_device", "on_after_batch_transfer", "validation_step", "test_step", "predict_step",
         "on_validation_model_eval", "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
         "on_predict_model_eval", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
         "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
         "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
         "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
         "on_predict_batch_start", "on_predict_batch_end")
CALLBACK_HOOKS = ("setup", "teardown", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
                  "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
                  "on_test_start", "on_test_end", "on_test_batch_start", "on_test_batch_end", "on_predict_start",
                  "on_predict_end", "on_predict_batch_start", "on_predict_batch_end")


def _kind(x):
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    return type(x).__name__ if not isinstance(x, torch.nn.Module) else "module"


def _wrap(obj, names, calls, prefix=""):
    """Replace each of ``names`` on the instance ``obj`` by a recorder (Lightning's test does the same)."""
    def call(name, fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        calls.append((prefix + name, tuple(_kind(a) for a in args if not hasattr(a, "fit_loop")
                                           and type(a).__name__ != "Trainer"), tuple(sorted(kwargs.items()))))
        return out

    for name in names:
        bound = getattr(obj, name)
        setattr(obj, name, functools.update_wrapper(functools.partial(call, name, bound), bound))


def hooked(L, calls):
    class Hooked(linear(L.LightningModule)):
        def forward(self, x):
            return self.layer(x)

        def validation_step(self, batch, batch_idx):
            self.log("v", self(batch[0]).sum())

        def test_step(self, batch, batch_idx):
            self.log("t", self(batch[0]).sum())

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def val_dataloader(self):
            return data(n=8)

        test_dataloader = predict_dataloader = val_dataloader

        def prepare_data(self):  # overridden so that it is called (as in Lightning's test)
            pass

        def configure_model(self):  # Lightning calls it only when overridden
            pass

        def on_validation_model_train(self):
            self.train()

    torch.manual_seed(0)
    module = Hooked()
    _wrap(module, HOOKS, calls)
    cb = L.Callback()
    _wrap(cb, CALLBACK_HOOKS, calls, "Callback.")
    return module, cb


def _trainer(L, tmp_path, callbacks=(), **flags):
    return L.Trainer(default_root_dir=str(tmp_path), accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=list(callbacks), **flags)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
@pytest.mark.parametrize("batches", [0, 2])
def test_F_LIT_DOOR_eval_stage_hook_order_matches_lightning(stage, batches, tmp_path):
    """configure_callbacks, prepare_data, setup(stage=), configure_model, zero_grad, the loader, eval mode, the
    stage's hooks per batch, teardown(stage=): the same calls in the same order; ``limit_*_batches=0`` asks for
    no loader and calls no loop hook."""
    seqs, results = {}, {}
    for name, L in _frameworks().items():
        calls = []
        module, cb = hooked(L, calls)
        trainer = _trainer(L, tmp_path / name, [cb], limit_val_batches=batches, limit_test_batches=batches,
                           limit_predict_batches=batches)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = getattr(trainer, stage)(module, **({} if stage == "predict" else {"verbose": False}))
        seqs[name] = calls
        results[name] = len(out) if out is not None else None
    assert seqs["taskfit"] == seqs["lightning"]
    assert results["taskfit"] == results["lightning"]
    names = [c[0] for c in seqs["taskfit"]]
    assert names[:6] == ["configure_callbacks", "prepare_data", "Callback.setup", "setup", "configure_model",
                         "zero_grad"]
    assert (f"{'val' if stage == 'validate' else stage}_dataloader" in names) == bool(batches)


class _DM:
    """A LightningDataModule body recording its hooks with their keyword arguments."""

    @staticmethod
    def make(L, calls):
        class DM(L.LightningDataModule):
            def prepare_data(self):
                calls.append(("prepare_data", ()))

            def setup(self, stage):
                calls.append(("setup", (stage,)))

            def teardown(self, stage):
                calls.append(("teardown", (stage,)))

            def train_dataloader(self):
                calls.append(("train_dataloader", ()))
                return data(n=8)

            def val_dataloader(self):
                calls.append(("val_dataloader", ()))
                return data(n=8)

            test_dataloader = predict_dataloader = val_dataloader
        dm = DM()
        for name in ("setup", "teardown"):  # records the keyword Lightning passes
            fn = getattr(dm, name)
            setattr(dm, name, functools.partial(lambda fn, n, *a, **k: calls.append((n, "kw", tuple(k)))
                                                or fn(*a, **k), fn, name))
        return dm


def test_F_LIT_DOOR_datamodule_hooks_per_stage_match_lightning(tmp_path):
    """A datamodule's prepare_data, setup(stage=...), its loaders (validation's first when the sanity check runs)
    and teardown(stage=...) in every stage: the same calls as Lightning's."""
    seqs = {}
    for name, L in _frameworks().items():
        calls = []
        torch.manual_seed(0)

        class M(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx):
                self.log("v", self.layer(batch[0]).sum())

            def test_step(self, batch, batch_idx):
                self.log("t", self.layer(batch[0]).sum())

            def predict_step(self, batch, batch_idx):
                return self.layer(batch[0])

        trainer = _trainer(L, tmp_path / name, max_epochs=1, limit_train_batches=2, limit_val_batches=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for stage in ("fit", "validate", "test", "predict"):
                kw = {} if stage in ("fit", "predict") else {"verbose": False}
                getattr(trainer, stage)(M(), datamodule=_DM.make(L, calls), **kw)
        seqs[name] = calls
    assert seqs["taskfit"] == seqs["lightning"]
    assert seqs["taskfit"][:5] == [("prepare_data", ()), ("setup", "kw", ("stage",)), ("setup", ("fit",)),
                                   ("val_dataloader", ()), ("train_dataloader", ())]


def test_F_LIT_DOOR_frozen_submodule_keeps_eval_mode(tmp_path):
    """A submodule the user put in eval mode stays there in fit, validate, test and predict; the rest trains in
    training mode and evaluates in eval mode (Lightning restores each submodule's own mode)."""
    seen = {}
    for name, L in _frameworks().items():
        modes = []

        class Frozen(linear(L.LightningModule)):
            def __init__(self):
                super().__init__()
                self.frozen = torch.nn.Linear(2, 2)
                self.frozen.eval()

            def _note(self, where):
                modes.append((where, self.layer.training, self.frozen.training))

            def training_step(self, batch, batch_idx):
                self._note("train")
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                self._note("val")

            def test_step(self, batch, batch_idx):
                self._note("test")

            def predict_step(self, batch, batch_idx):
                self._note("predict")
                return self.layer(batch[0])

        torch.manual_seed(0)
        module = Frozen()
        trainer = _trainer(L, tmp_path / name, max_epochs=1, limit_train_batches=3, limit_val_batches=1,
                           val_check_interval=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data(n=12), data(n=4))
            trainer.validate(module, data(n=4), verbose=False)
            trainer.test(module, data(n=4), verbose=False)
            trainer.predict(module, data(n=4))
        seen[name] = (modes, module.layer.training, module.frozen.training)
    assert seen["taskfit"] == seen["lightning"]
    assert all(not frozen for _, _, frozen in seen["taskfit"][0])


def test_F_LIT_DOOR_predict_over_two_loaders(tmp_path):
    """``predict`` with two loaders returns one list per loader; ``predict_step`` and the batch hooks get
    ``dataloader_idx``, as in Lightning."""
    got = {}
    for name, L in _frameworks().items():
        idx = []

        class P(linear(L.LightningModule)):
            def predict_step(self, batch, batch_idx, dataloader_idx=0):
                return self.layer(batch[0]) + dataloader_idx

            def on_predict_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
                idx.append((batch_idx, dataloader_idx))

        torch.manual_seed(0)
        loaders = [data(n=8), DataLoader(TensorDataset(torch.ones(4, 4), torch.ones(4, 1)), batch_size=2)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            preds = _trainer(L, tmp_path / name).predict(P(), loaders)
        got[name] = (preds, idx)
    (pl, il), (pt, it) = got["lightning"], got["taskfit"]
    assert it == il == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [len(p) for p in pt] == [len(p) for p in pl] == [2, 2]
    assert all(torch.equal(a, b) for x, y in zip(pt, pl) for a, b in zip(x, y))
