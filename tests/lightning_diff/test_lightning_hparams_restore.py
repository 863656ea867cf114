"""Hyperparameters and restoring, the same script under ``lightning`` and ``taskfit.lightning`` (scenarios after
Lightning's tests_pytorch/models/test_hparams.py and test_restore.py): ``save_hyperparameters`` along a chain of
``__init__`` calls, configs and dataclasses; ``load_from_checkpoint`` with overrides, a config argument and
``strict``; the hyperparameters the loggers get and ``hparams.yaml`` beside them; a missing ``ckpt_path``
(F-LIT-HP)."""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from dataclasses import dataclass

import pytest
import torch
import yaml
from harness import data, regression
from torch.nn import functional as F
from torch.utils.data import DataLoader
from two_doors import callbacks_of, frameworks


def _loggers(name):
    import importlib

    return importlib.import_module("lightning.pytorch.loggers" if name == "lightning" else "taskfit.lightning.loggers")


def _quiet(L, tmp_path, **kwargs):
    """A Trainer of ``L`` for 2 training batches, no sanity check, progress bar or summary."""
    options = {"default_root_dir": str(tmp_path), "max_epochs": 1, "limit_train_batches": 2, "num_sanity_val_steps": 0,
               "enable_progress_bar": False, "enable_model_summary": False}
    options.update(kwargs)
    return L.Trainer(**options)


def _regressor(L, save=True):
    """A regressor on :func:`harness.data` (its own ``train_dataloader``); ``save``: it calls
    ``save_hyperparameters()``."""
    class Regressor(L.LightningModule):
        def __init__(self, hidden=3, lr=0.1):
            super().__init__()
            if save:
                self.save_hyperparameters()
            self.lr = lr
            self.layer = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Linear(hidden, 1))

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", F.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return data()

    return Regressor


def _hierarchy(L):
    """The class chains of Lightning's test_collect_init_arguments and test_hparams_ignore_in_subclass..."""
    class Base(L.LightningModule):
        def __init__(self, batch_size=64):
            super().__init__()
            self.save_hyperparameters()

    class NonSaving(Base):
        def __init__(self, *args, subclass_arg=1200, **kwargs):
            super().__init__(*args, **kwargs)

    class Saving(Base):
        def __init__(self, *args, subclass_arg=1200, **kwargs):
            super().__init__(*args, **kwargs)
            self.save_hyperparameters()

    class Args(L.LightningModule):
        def __init__(self, arg1, arg2=90, arg3=50):
            super().__init__()
            self.save_hyperparameters()

    class Dropping(Args):
        def __init__(self, arg1, arg2=90, arg3=50):
            super().__init__(arg1, arg2, arg3)
            self.save_hyperparameters(ignore=("arg2",))

    class Config(L.LightningModule):
        def __init__(self, hparams):
            super().__init__()
            self.save_hyperparameters(hparams)

    @dataclass
    class Data(L.LightningModule):
        mandatory: int
        optional: str = "optional"

        def __post_init__(self):
            super().__init__()
            self.save_hyperparameters()

    class Holder:  # not a module: its arguments are not collected
        def __init__(self, run_id="abc"):
            self.child = Base(batch_size=5)

    return Base, NonSaving, Saving, Dropping, Config, Data, Holder


def test_F_LIT_HP_save_hyperparameters_like_lightning():
    """The values, order and type of ``hparams`` for a chain of ``__init__`` calls (a subclass that does not save
    still has its arguments saved by the base), ``ignore`` dropping a base class's value, a dict or Namespace
    config, a dataclass module and a module held by a plain object; the refusal of a primitive config and the
    ``nn.Module`` warning, as Lightning's."""
    seen = {}
    for name, L in frameworks().items():
        Base, NonSaving, Saving, Dropping, Config, Data, Holder = _hierarchy(L)
        config = Config(Namespace(test_arg=14, other="x"))
        out = [dict(NonSaving(batch_size=3).hparams), dict(Saving(subclass_arg=1).hparams),
               dict(Dropping(14).hparams), list(Dropping(14).hparams), dict(config.hparams),
               type(config.hparams).__name__, dict(Config({"a": 1}).hparams), dict(Data(33).hparams),
               dict(Holder().child.hparams), dict(Base(batch_size=2).hparams_initial)]
        with pytest.raises(ValueError, match=r"Primitives \(<class 'bool'>") as err:
            Config(42)
        out.append(str(err.value))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Args = Dropping.__mro__[1]
            module = Args(torch.nn.Linear(1, 1))
        out.append([str(w.message) for w in caught if "nn.Module" in str(w.message)])
        out.append(list(module.hparams))
        seen[name] = out
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][:3] == [{"batch_size": 3, "subclass_arg": 1200}, {"batch_size": 64, "subclass_arg": 1},
                                   {"arg1": 14, "arg3": 50}]


def test_F_LIT_HP_load_from_checkpoint_like_lightning(tmp_path):
    """``trainer.save_checkpoint(path)`` then ``load_from_checkpoint(path)``: the saved hyperparameters rebuild the
    module (keyword overrides win, names ``__init__`` does not take are dropped), a module saved from one config
    argument is rebuilt through it, the weights equal the trained ones, the module comes back in training mode, and
    ``strict`` decides whether extra
    weights are refused (not strict: Lightning's warnings; a ``strict`` that contradicts ``strict_loading``: its
    ValueError), as Lightning."""
    seen = {}
    for name, L in frameworks().items():
        torch.manual_seed(0)
        Regressor = _regressor(L)
        model = Regressor(hidden=5)
        trainer = _quiet(L, tmp_path / name, logger=False, enable_checkpointing=False)
        trainer.fit(model)
        path = str(tmp_path / name / "saved.ckpt")
        trainer.save_checkpoint(path)
        loaded = Regressor.load_from_checkpoint(path, lr=0.5, not_an_argument=1)
        x = torch.randn(3, 4)
        same = torch.equal(loaded(x), model.eval()(x))

        class Configured(_regressor(L, save=False)):
            def __init__(self, config):
                super().__init__(**config)
                self.save_hyperparameters(config)

        torch.manual_seed(0)
        configured = Configured({"hidden": 2, "lr": 0.1})
        _quiet(L, tmp_path / f"{name}-c", logger=False, enable_checkpointing=False).fit(configured)
        cpath = str(tmp_path / f"{name}-c" / "saved.ckpt")
        configured.trainer.save_checkpoint(cpath)
        again = Configured.load_from_checkpoint(cpath)

        class Wider(Regressor):
            def __init__(self, hidden=3, lr=0.1):
                super().__init__(hidden, lr)
                self.extra = torch.nn.Linear(2, 2)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Wider.load_from_checkpoint(path, strict=False)
        not_strict = [str(w.message) for w in caught if "Found keys" in str(w.message)]

        class Loose(Regressor):
            def __init__(self, hidden=3, lr=0.1):
                super().__init__(hidden, lr)
                self.strict_loading = False

        with pytest.raises(ValueError, match=r"strict=True\)` which is in conflict with `Loose.strict_loading=False"):
            Loose.load_from_checkpoint(path, strict=True)
        with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "extra.weight", "extra.bias"'):
            Wider.load_from_checkpoint(path, strict=True)
        wide = Wider()
        wider_trainer = _quiet(L, tmp_path / f"{name}-w", logger=False, enable_checkpointing=False, max_steps=1)
        wider_trainer.fit(wide)
        wpath = str(tmp_path / f"{name}-w" / "saved.ckpt")
        wider_trainer.save_checkpoint(wpath)
        for _ in range(3):  # the key order of the message is fixed, as Lightning's
            with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "extra.weight", "extra.bias"'):
                Regressor.load_from_checkpoint(wpath, strict=True)
        seen[name] = (dict(loaded.hparams), same, loaded.training, dict(again.hparams),
                      torch.equal(again.layer[0].weight, configured.layer[0].weight), not_strict)
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][:5] == ({"hidden": 5, "lr": 0.5}, True, True, {"hidden": 2, "lr": 0.1}, True)


def test_F_LIT_HP_logged_hyperparams_and_hparams_yaml_like_lightning(tmp_path):
    """The loggers get the module's and the datamodule's hyperparameters merged (nothing else), ``hparams.yaml``
    lands in the logger's folder and ``load_from_checkpoint(hparams_file=)`` reads it, the datamodule is rebuilt
    from the checkpoint (``LightningDataModule.load_from_checkpoint``); names both hold with
    different values stop ``fit`` with Lightning's RuntimeError; a missing ``ckpt_path`` raises
    FileNotFoundError; an unpicklable value is dropped from ``hparams`` with Lightning's warning."""
    seen = {}
    for name, L in frameworks().items():
        class Data(L.LightningDataModule):
            def __init__(self, batch_size=4, lr=0.1):
                super().__init__()
                self.save_hyperparameters()

            def train_dataloader(self):
                return DataLoader(regression(16), batch_size=self.hparams.batch_size)

        Regressor = _regressor(L)
        root = tmp_path / name
        logger = _loggers(name).CSVLogger(str(root))
        trainer = _quiet(L, root, logger=logger, callbacks=[callbacks_of(L).ModelCheckpoint(dirpath=str(root))])
        model = Regressor(hidden=2)
        trainer.fit(model, datamodule=Data(batch_size=8))
        hparams_file = os.path.join(logger.log_dir, "hparams.yaml")
        with open(hparams_file) as f:
            written = yaml.safe_load(f)
        path = str(root / "saved.ckpt")
        trainer.save_checkpoint(path)
        loaded = Regressor.load_from_checkpoint(path, hparams_file=hparams_file)
        data_again = Data.load_from_checkpoint(path, lr=0.2)
        with pytest.raises(RuntimeError, match="Error while merging hparams: the keys"):
            _quiet(L, root, logger=_loggers(name).CSVLogger(str(root))).fit(
                Regressor(lr=0.3), datamodule=Data())
        with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
            _quiet(L, root, logger=False).fit(Regressor(), ckpt_path=str(root / "missing.ckpt"))

        class Unpicklable(Regressor):
            def __init__(self, fn=lambda x: x, hidden=3):
                super().__init__(hidden=hidden)

        odd = Unpicklable()
        with pytest.warns(UserWarning, match="Attribute 'fn' removed from hparams because it cannot be pickled"):
            _quiet(L, root, logger=False, enable_checkpointing=False).fit(odd)
        seen[name] = (written, dict(loaded.hparams), dict(data_again.hparams), sorted(odd.hparams))
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][0] == {"hidden": 2, "lr": 0.1, "batch_size": 8}
    assert seen["taskfit"][2] == {"batch_size": 8, "lr": 0.2}
