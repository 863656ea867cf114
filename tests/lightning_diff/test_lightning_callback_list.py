"""``trainer.callbacks`` as Lightning lists it, the same script under ``lightning`` and ``taskfit.lightning``
(F-LIT-6): the user's callbacks in their order, then the implicit checkpoint / timer / progress bar / model summary
in Lightning's order, checkpoint callbacks last; the door's own loop, metric and profiler callbacks are not in it,
before, during or after ``fit``/``validate``/``predict`` with a datamodule; two stateful callbacks with one
``state_key`` are refused at construction with Lightning's error."""

from __future__ import annotations

import warnings
from unittest import mock

import pytest
import torch
from harness import linear, regression
from torch.nn import functional as F
from torch.utils.data import DataLoader
from two_doors import callbacks_of, frameworks


def _kinds(L, callbacks, given):
    """Each callback as its index in ``given`` or its built-in kind (Lightning picks a rich bar and summary when
    rich is installed: the kind, not the class, is compared)."""
    cb = callbacks_of(L)
    kinds = [("ckpt", cb.ModelCheckpoint), ("timer", cb.Timer), ("bar", cb.ProgressBar), ("summary", cb.ModelSummary)]
    out = []
    for c in callbacks:
        index = next((i for i, g in enumerate(given) if g is c), None)
        out.append(index if index is not None else next((k for k, t in kinds if isinstance(c, t)), type(c).__name__))
    return out


def test_F_LIT_6_trainer_callbacks_lists_what_lightning_lists(tmp_path):
    """Given callbacks keep their order with checkpoints moved last; the implicit ones follow in Lightning's order;
    with everything turned off the list is empty."""
    seen = {}
    for name, L in frameworks().items():
        cb = callbacks_of(L)
        given = [cb.ModelCheckpoint(dirpath=tmp_path / name / "a", monitor="a"), cb.TQDMProgressBar(),
                 cb.LearningRateMonitor(), cb.ModelSummary(), cb.ModelCheckpoint(dirpath=tmp_path / name / "b", monitor="b")]
        plain = [cb.LearningRateMonitor()]
        seen[name] = (
            _kinds(L, L.Trainer(callbacks=list(given), logger=False).callbacks, given),
            _kinds(L, L.Trainer(callbacks=list(plain), logger=False, max_time="00:00:01:00",
                                default_root_dir=tmp_path / name).callbacks, plain),
            L.Trainer(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      logger=False).callbacks)
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"] == ([1, 2, 3, 0, 4], [0, "timer", "bar", "summary", "ckpt"], [])


def test_F_LIT_6_trainer_callbacks_unchanged_while_running(tmp_path):
    """During and after fit, validate and predict with a datamodule the list is the one set up (the datamodule's
    checkpoint state and the prediction collector are not entries; the state's round trip is in
    test_lightning_datamodule.py); the datamodule's state is in the checkpoint."""
    seen = {}
    for name, L in frameworks().items():
        cb = callbacks_of(L)

        class DM(L.LightningDataModule):
            def train_dataloader(self):
                return DataLoader(regression(8), batch_size=4)

            def val_dataloader(self):
                return DataLoader(regression(8), batch_size=4)

            def predict_dataloader(self):
                return DataLoader(regression(4), batch_size=4)

            def state_dict(self):
                return {"seen": 3}

        class Model(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx):
                self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

            def on_save_checkpoint(self, checkpoint):
                saved.append(next((v for k, v in checkpoint.items() if k.endswith(".DM")), None))

            def predict_step(self, batch, batch_idx):
                return self.layer(batch[0])

        lengths, saved = [], []

        class Count(L.Callback):
            def on_train_start(self, trainer, pl_module):
                lengths.append(len(trainer.callbacks))

            def on_validation_start(self, trainer, pl_module):
                lengths.append(len(trainer.callbacks))

            def on_predict_start(self, trainer, pl_module):
                lengths.append(len(trainer.callbacks))

        torch.manual_seed(0)
        ckpt = cb.ModelCheckpoint(dirpath=tmp_path / name, save_last=True)
        count = Count()
        trainer = L.Trainer(default_root_dir=tmp_path / name, max_epochs=1, logger=False, callbacks=[ckpt, count],
                            enable_progress_bar=False, num_sanity_val_steps=0)
        model, dm = Model(), DM()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, datamodule=dm)
            trainer.validate(model, datamodule=dm)
            trainer.predict(model, datamodule=dm)
        seen[name] = (lengths, len(trainer.callbacks), _kinds(L, trainer.callbacks, [ckpt, count]), saved[-1])
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"] == ([3, 3, 3, 3], 3, [1, "summary", 0], {"seen": 3})


def test_F_LIT_6_duplicate_state_keys_refused():
    """Two stateful callbacks with one ``state_key`` raise Lightning's RuntimeError before any work; stateless
    duplicates and distinct keys are fine."""
    messages = {}
    for name, L in frameworks().items():
        class Same(L.Callback):
            @property
            def state_key(self):
                return "same_key"

            def state_dict(self):
                return {"state": 1}

        class Keyed(L.Callback):
            def __init__(self, key):
                self.key = key

            @property
            def state_key(self):
                return self.key

            def state_dict(self):
                return {"state": self.key}

        with pytest.raises(RuntimeError) as err:
            L.Trainer(callbacks=[Same(), L.Callback(), Same()], logger=False)
        messages[name] = str(err.value)
        assert len(L.Trainer(callbacks=[L.Callback(), L.Callback(), Keyed("a"), Keyed("b")], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False).callbacks) == 4
    assert messages["taskfit"] == messages["lightning"]
    assert messages["taskfit"].startswith("Found more than one stateful callback of type `Same`.")


def test_F_LIT_6_generated_state_keys_in_the_checkpoint(tmp_path):
    """``_generate_state_key`` (the state key Lightning's docs show for several instances of one callback) gives
    Lightning's keys; every callback's state is in the checkpoint whatever the checkpoint callback's position."""
    seen = {}
    for name, L in frameworks().items():
        class Plain(L.Callback):
            def state_dict(self):
                return {"content0": 0}

        class Keyed(L.Callback):
            def __init__(self, unique=None):
                self.unique = unique

            @property
            def state_key(self):
                return self._generate_state_key(unique=self.unique)

            def state_dict(self):
                return {"content1": self.unique}

        saved = {}

        class Model(linear(L.LightningModule)):
            def on_save_checkpoint(self, checkpoint):
                saved.update(checkpoint["callbacks"])

        ckpt = callbacks_of(L).ModelCheckpoint(dirpath=tmp_path / name, filename="all_states")
        trainer = L.Trainer(default_root_dir=tmp_path / name, max_steps=1, logger=False, enable_progress_bar=False,
                            callbacks=[Plain(), ckpt, Keyed("one"), Keyed("two")])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Model(), DataLoader(regression(8), batch_size=4))
        seen[name] = {k: v for k, v in saved.items() if not k.startswith("ModelCheckpoint")}, sorted(saved)
    assert seen["taskfit"] == seen["lightning"]
    assert {k.rsplit(".", 1)[-1]: v for k, v in seen["taskfit"][0].items()} == {"Plain": {"content0": 0}, "Keyed{'unique': 'one'}": {"content1": "one"},
                                  "Keyed{'unique': 'two'}": {"content1": "two"}}


@mock.patch("lightning.pytorch.trainer.connectors.callback_connector._RICH_AVAILABLE", False)
def test_F_LIT_6_configure_callbacks_replace_by_class_or_base(caplog):
    """Lightning's default bar without rich is a ``TQDMProgressBar``, as the door's. A module's ``configure_callbacks`` callbacks replace the trainer's callbacks of their class or a base class
    (a custom ``TQDMProgressBar`` replaces the trainer's bar; a bare ``Callback`` stays), with Lightning's INFO line
    naming the replaced classes (the cases of Lightning's ``test_attach_model_callbacks``, through ``validate``)."""
    seen = {}
    for name, L in frameworks().items():
        cb = callbacks_of(L)
        es1, es2, bar = cb.EarlyStopping(monitor="red"), cb.EarlyStopping(monitor="blue"), cb.TQDMProgressBar()
        lrm, gas = cb.LearningRateMonitor(), cb.GradientAccumulationScheduler({1: 1})

        class CustomBar(cb.TQDMProgressBar):
            pass

        custom, bare = CustomBar(), L.Callback()
        cases = [([], []), ([es1], [bar]), ([bar, cb.EarlyStopping(monitor="red")], [es1]),
                 ([cb.LearningRateMonitor(), cb.EarlyStopping(monitor="yellow"), cb.LearningRateMonitor()], [es1, lrm]),
                 ([cb.LearningRateMonitor(), bar, cb.EarlyStopping(monitor="y")], [es1, lrm, gas, es2]),
                 ([bar], [custom]), ([bare], [custom])]
        known = [es1, es2, bar, lrm, gas, custom, bare]
        lists, lines = [], []
        for trainer_cbs, model_cbs in cases:
            class Model(linear(L.LightningModule)):
                def validation_step(self, batch, batch_idx):
                    self.log("v", F.mse_loss(self.layer(batch[0]), batch[1]))

                def configure_callbacks(self, _cbs=model_cbs):
                    return list(_cbs)

            trainer = L.Trainer(enable_checkpointing=False, enable_model_summary=False, logger=False,
                                enable_progress_bar=any(isinstance(c, cb.ProgressBar) for c in trainer_cbs + model_cbs),
                                callbacks=list(trainer_cbs), limit_val_batches=1)
            caplog.clear()
            with caplog.at_level("INFO"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.validate(Model(), DataLoader(regression(4), batch_size=4), verbose=False)
            lists.append([next((i for i, k in enumerate(known) if k is c), "other") for c in trainer.callbacks])
            lines.append([r.getMessage() for r in caplog.records if "will override" in r.getMessage()])
        seen[name] = lists, lines
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][0] == [[], [0, 2], [2, 0], [0, 3], [2, 0, 3, 4, 1], [5], [6, 5]]
