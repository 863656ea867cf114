"""Lightning's callbacks and loggers under their Lightning names, the same script under ``lightning`` and
``taskfit.lightning`` (F-LIT-6, F-LIT-LOG): ``Timer`` (a spent budget trains nothing), ``LearningRateMonitor``
(names, values, checks), ``GradientAccumulationScheduler``'s checks, ``BaseFinetuning``'s warning, a module's
``configure_callbacks`` with a stand-in callback, ``CSVLogger`` and ``TensorBoardLogger`` files."""

from __future__ import annotations

import argparse
import csv
import os
import warnings
from datetime import timedelta
from unittest.mock import Mock

import pytest
import torch
import yaml
from harness import data, linear
from two_doors import callbacks_of, frameworks


def loggers_of(L):
    """The ``loggers`` module of ``L`` (``lightning.pytorch.loggers`` or ``taskfit.lightning.loggers``)."""
    import lightning.pytorch.loggers
    import taskfit.lightning.loggers

    return lightning.pytorch.loggers if L.__name__ == "lightning" else taskfit.lightning.loggers


def _trainer(L, tmp_path, name, **kw):
    opts = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
            "enable_checkpointing": False, "num_sanity_val_steps": 0, "default_root_dir": str(tmp_path / name)}
    return L.Trainer(**{**opts, **kw})


def _fit(trainer, model, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, *args, **kw)


def test_F_LIT_6_timer_spent_budget_trains_nothing_like_lightning(tmp_path):
    """Timer(duration=0): Lightning stops at on_fit_start, before any step (global_step 0, current_epoch 0, weights
    untouched), for both intervals; Lightning's duration/interval messages."""
    seen = {}
    for name, L in frameworks().items():
        cbs = callbacks_of(L)
        for interval in ("step", "epoch"):
            torch.manual_seed(0)
            m = linear(L.LightningModule)()
            before = [p.detach().clone() for p in m.parameters()]
            timer = cbs.Timer(duration=timedelta(0), interval=interval, verbose=False)
            t = _trainer(L, tmp_path, f"{name}-{interval}", max_epochs=3, callbacks=[timer])
            _fit(t, m, data())
            seen[name, interval] = (t.global_step, t.current_epoch,
                                    all(torch.equal(a, b) for a, b in zip(before, m.parameters())))
        errors = []
        for kwargs in ({"duration": "6:00:00"}, {"duration": timedelta(seconds=1), "interval": "invalid"}):
            with pytest.raises(Exception) as err:  # Lightning: MisconfigurationException, taskfit: ValueError
                cbs.Timer(**kwargs)
            errors.append(str(err.value).split(" Expected")[0].split(" Possible")[0])  # Lightning: set order
        seen[name, "errors"] = errors
    for key in (("step",), ("epoch",), ("errors",)):
        assert seen[("taskfit", *key)] == seen[("lightning", *key)]
    assert seen["taskfit", "step"] == (0, 0, True)


def _lr_model(base):
    class TwoOptimizers(linear(base)):
        def __init__(self):
            super().__init__()
            self.other = torch.nn.Linear(4, 1)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            x, y = batch
            for opt, layer in zip(self.optimizers(), (self.layer, self.other)):
                loss = torch.nn.functional.mse_loss(layer(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            for sched in self.lr_schedulers():
                sched.step()

        def configure_optimizers(self):
            sgd = torch.optim.SGD([{"params": self.layer.weight, "name": "weight"},
                                   {"params": self.layer.bias, "name": "bias", "lr": 0.05}], lr=0.1, momentum=0.9)
            adam = torch.optim.Adam(self.other.parameters(), lr=0.01, weight_decay=0.1)
            return [sgd, adam], [{"scheduler": torch.optim.lr_scheduler.StepLR(sgd, 1, gamma=0.5), "name": "main",
                                  "interval": "step"},
                                 torch.optim.lr_scheduler.StepLR(adam, 1, gamma=0.9)]
    return TwoOptimizers


def test_F_LIT_6_lr_monitor_names_and_values_like_lightning(tmp_path):
    """LearningRateMonitor with a named scheduler, named parameter groups, an epoch scheduler on a second optimizer
    and manual optimization (two optimizer steps per batch): the same series names (scheduled optimizers first),
    the same learning-rate, momentum and weight-decay values as Lightning, logged every 2 batches."""
    seen = {}
    for name, L in frameworks().items():
        cbs = callbacks_of(L)
        mon = cbs.LearningRateMonitor(log_momentum=True, log_weight_decay=True)
        t = _trainer(L, tmp_path, name, max_epochs=2, log_every_n_steps=2, callbacks=[mon],
                     logger=loggers_of(L).CSVLogger(str(tmp_path / name)))
        _fit(t, _lr_model(L.LightningModule)(), data())
        seen[name] = (mon.lrs, mon.last_momentum_values, mon.last_weight_decay_values)
    assert seen["taskfit"] == seen["lightning"]
    assert list(seen["taskfit"][0]) == ["main/weight", "main/bias", "lr-Adam"]


def test_F_LIT_6_lr_monitor_and_accumulation_checks_like_lightning(tmp_path):
    """The checks Lightning makes at on_train_start: LearningRateMonitor without a logger, duplicate parameter group
    names; GradientAccumulationScheduler with manual optimization or with accumulate_grad_batches, and its warning
    for an overridden optimizer_step; BaseFinetuning's warning for parameters already in the optimizer."""
    seen = {}
    for name, L in frameworks().items():
        cbs, out = callbacks_of(L), []
        m = linear(L.LightningModule)()
        m.configure_optimizers = lambda m=m: torch.optim.SGD([{"params": [m.layer.weight], "name": "a"},
                                                              {"params": [m.layer.bias], "name": "a"}], lr=0.1)
        for kw in ({"logger": False}, {"logger": loggers_of(L).CSVLogger(str(tmp_path / name))}):
            with pytest.raises(Exception) as err:
                _fit(_trainer(L, tmp_path, name, max_steps=1, callbacks=[cbs.LearningRateMonitor()], **kw), m, data())
            out.append(str(err.value))
        sched = cbs.GradientAccumulationScheduler({1: 2})
        manual = linear(L.LightningModule)()
        manual.automatic_optimization = False
        with pytest.raises(RuntimeError) as err:
            sched.on_train_start(_trainer(L, tmp_path, name), manual)
        out.append(str(err.value).split())

        class Stepping(linear(L.LightningModule)):
            def optimizer_step(self, *args, **kwargs):
                super().optimizer_step(*args, **kwargs)
        with pytest.warns(UserWarning) as record:
            sched.on_train_start(_trainer(L, tmp_path, name), Stepping())
        out.append(str(record[0].message))
        with pytest.raises(ValueError) as err:
            sched.on_train_start(_trainer(L, tmp_path, name, accumulate_grad_batches=2), linear(L.LightningModule)())
        out.append(str(err.value).split(" Either")[0])
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with pytest.warns(UserWarning) as record:
            cbs.BaseFinetuning.unfreeze_and_add_param_group(m, opt)
        out.append(str(record[0].message))
        seen[name] = out
    assert seen["taskfit"] == seen["lightning"]


def test_F_LIT_6_configure_callbacks_stand_in_called_like_lightning(tmp_path):
    """A module's configure_callbacks returning a Mock(spec=Callback): it joins the trainer's callbacks last (no
    checkpointing) and receives the same Lightning hook calls, in the same order, as the same kind of callback given
    to the Trainer."""
    seen = {}
    for name, L in frameworks().items():
        given, own = Mock(spec=L.Callback), Mock(spec=L.Callback)

        class WithCallbacks(linear(L.LightningModule)):
            def configure_callbacks(self, own=own):
                return [own]
        t = _trainer(L, tmp_path, name, max_epochs=1, callbacks=[given])
        _fit(t, WithCallbacks(), data(n=8))
        seen[name] = ([c[0] for c in own.method_calls], t.callbacks[-1] is own)
        assert [c[0] for c in given.method_calls] == seen[name][0]
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][0][:2] == ["setup", "on_fit_start"]


def test_F_LIT_LOG_csv_logger_like_lightning(tmp_path):
    """CSVLogger: log_metrics without a step numbers the rows, experiment.metrics holds the unwritten rows until the
    flush, hparams.yaml keeps what YAML can write (a class too), as Lightning's files."""
    seen = {}
    for name, L in frameworks().items():
        lg = loggers_of(L).CSVLogger(str(tmp_path / name), flush_logs_every_n_steps=2)
        lg.log_hyperparams({"lr": 0.1, "layer": torch.nn.BatchNorm1d, "nested": {"a": [1, 2]}})
        lg.log_metrics({"a": torch.tensor(1.5)})
        pending = [dict(r) for r in lg.experiment.metrics]
        lg.log_metrics({"a": 2.0, "b": 3})
        lg.save()
        with open(lg.experiment.metrics_file_path, newline="") as f:
            rows = [dict(r) for r in csv.DictReader(f)]
        with open(os.path.join(lg.log_dir, "hparams.yaml")) as f:
            hp = yaml.unsafe_load(f)
        seen[name] = (pending, rows, hp, lg.experiment.metrics)
    assert seen["taskfit"] == seen["lightning"]


def test_F_LIT_LOG_tensorboard_logger_like_lightning(tmp_path):
    """TensorBoardLogger: log_dir with sub_dir and ``~`` expanded; log_hyperparams(params, metrics) with keys of any
    type and nested Namespaces; a fit writes log_dir/hparams.yaml with the module's save_hyperparameters values only;
    log_graph warns without an input array."""
    pytest.importorskip("tensorboard")
    seen = {}
    for name, L in frameworks().items():
        out = [loggers_of(L).TensorBoardLogger("~/tb", name="n", version=3, sub_dir="s").log_dir]
        lg = loggers_of(L).TensorBoardLogger(str(tmp_path / name), default_hp_metric=False)
        lg.log_hyperparams({"a": 1, 123: 3, "ns": argparse.Namespace(x=1)}, {"m": torch.tensor([0.5])})
        out.append(sorted(os.listdir(lg.log_dir)) != [])

        class Saved(linear(L.LightningModule)):
            def __init__(self, b1=0.5, b2=0.9):
                super().__init__()
                self.save_hyperparameters()
        tb = loggers_of(L).TensorBoardLogger(str(tmp_path / f"{name}-fit"), log_graph=True)
        _fit(_trainer(L, tmp_path, name, max_steps=1, logger=tb), Saved(), data(n=4))
        with open(os.path.join(tb.log_dir, "hparams.yaml")) as f:
            out.append(yaml.safe_load(f))
        m = Saved()
        with pytest.warns(UserWarning) as record:
            tb.log_graph(m)
        out.append(str(record[0].message))
        seen[name] = out
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][2] == {"b1": 0.5, "b2": 0.9}


def test_F_LIT_6_prediction_writer_batch_indices_like_lightning(tmp_path):
    """BasePredictionWriter("batch_and_epoch") on a shuffled loader with two workers: each batch's prediction with
    its samples' dataset indices, then all predictions with the per-loader index lists, as Lightning's calls."""
    seen = {}
    for name, L in frameworks().items():
        class Writer(callbacks_of(L).BasePredictionWriter):
            calls: list
            def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dl_idx):
                self.calls.append(("batch", prediction.tolist(), batch_indices, batch_idx, dl_idx))

            def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                self.calls.append(("epoch", [p.tolist() for p in predictions], batch_indices))

        class Predicting(linear(L.LightningModule)):
            def predict_step(self, batch, batch_idx):
                return self.layer(batch[0])

        torch.manual_seed(0)
        m = Predicting()
        loader = torch.utils.data.DataLoader(data().dataset, batch_size=4, shuffle=True, num_workers=2,
                                             generator=torch.Generator().manual_seed(1))
        writer = Writer("batch_and_epoch")
        writer.calls = []
        t = _trainer(L, tmp_path, name, callbacks=[writer])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.predict(m, loader, return_predictions=False)
        seen[name] = writer.calls
    assert seen["taskfit"] == seen["lightning"]
    assert len(seen["taskfit"]) == 5 and sorted(i for b in seen["taskfit"][-1][2][0] for i in b) == list(range(16))
