"""Lightning ``Trainer`` flags under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``: the same attributes,
messages, grad modes and validation schedule (F-LIT-DOOR-FLAGS): ``PL_TRAINER_*`` environment defaults,
``barebones``, ``inference_mode``, ``fast_dev_run``'s logger, ``max_epochs`` left unset, a time-based
``val_check_interval``."""

import logging
import time
import warnings

import pytest
import torch

from harness import data, linear
from two_doors import frameworks


def _loggers(L):
    """``lightning.pytorch.loggers`` or ``taskfit.lightning.loggers``."""
    import lightning.pytorch.loggers

    return lightning.pytorch.loggers if L.__name__ == "lightning" else L.loggers


def _quiet(**kw):
    return dict(enable_progress_bar=False, enable_model_summary=False, **kw)


def test_F_LIT_DOOR_FLAGS_env_var_defaults(monkeypatch, tmp_path):
    """``PL_TRAINER_<FLAG>`` sets a flag's default (read as a Python literal); a flag given wins."""
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_DEFAULT_ROOT_DIR", str(tmp_path))  # not a literal: the text itself
    got = {}
    for name, L in frameworks().items():
        a = L.Trainer()
        b = L.Trainer(logger=True, max_steps=42)
        got[name] = (a.logger is None, a.max_steps, a.max_epochs, str(a.default_root_dir), b.logger is None,
                     b.max_steps)
    assert got["taskfit"] == got["lightning"] == (True, 7, None, str(tmp_path), False, 42)


def test_F_LIT_DOOR_FLAGS_max_epochs_unset_until_fit(tmp_path):
    """``max_epochs`` not given reads None until ``fit``, then 1000 with Lightning's ``PossibleUserWarning`` (no
    ``max_steps``) or -1 (with ``max_steps``); ``fast_dev_run`` gives 1 and no warning."""
    got = {}
    for name, L in frameworks().items():
        class Stop(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                self.trainer.should_stop = True
                return super().training_step(batch, batch_idx)

        rows = []
        for kw in ({}, {"max_steps": 2}, {"fast_dev_run": 2}):
            trainer = L.Trainer(default_root_dir=str(tmp_path / name), logger=False, enable_checkpointing=False,
                                limit_train_batches=1, **_quiet(**kw))
            before = trainer.max_epochs
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer.fit(Stop(), data(n=8))
            warned = [type(w.message).__name__ for w in caught if "`max_epochs` was not set" in str(w.message)]
            rows.append((before, trainer.max_epochs, trainer.max_steps, trainer.current_epoch, warned))
        got[name] = rows
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][0][:2] == (None, 1000) and got["taskfit"][0][4] == ["PossibleUserWarning"]


def test_F_LIT_DOOR_FLAGS_barebones(caplog, tmp_path):
    """``barebones=True`` turns off checkpointing, loggers, the bar, the summary, logging and the sanity check,
    refuses each flag that asks for one of them with Lightning's message, and ``self.log`` warns and logs
    nothing."""
    got = {}
    refused = [dict(enable_checkpointing=True), dict(logger=True), dict(enable_progress_bar=True),
               dict(enable_model_summary=True), dict(log_every_n_steps=1), dict(num_sanity_val_steps=1),
               dict(fast_dev_run=1), dict(detect_anomaly=True), dict(profiler="simple")]
    for name, L in frameworks().items():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            trainer = L.Trainer(barebones=True, default_root_dir=str(tmp_path), max_steps=2)
        info = [r.getMessage() for r in caplog.records if "barebones=True)` mode" in r.getMessage()]
        messages = []
        for kw in refused:
            with pytest.raises(ValueError) as err:
                L.Trainer(barebones=True, **kw)
            messages.append(str(err.value))
        warned = []

        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self.log("foo", 1.0)
                warned.extend(str(w.message) for w in caught)
                return super().training_step(batch, batch_idx)

        trainer.fit(M(), data(n=8))
        logged = "foo" in trainer.callback_metrics  # (the run's own rows are another gap: not compared here)
        got[name] = (trainer.barebones, len(trainer.checkpoint_callbacks), len(trainer.loggers),
                     trainer.progress_bar_callback is None, trainer.log_every_n_steps, trainer.num_sanity_val_steps,
                     bool(trainer.fast_dev_run), trainer._detect_anomaly, type(trainer.profiler).__name__,
                     info, messages, logged, sorted(set(warned)))
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][-1] and got["taskfit"][9]


@pytest.mark.parametrize("inference_mode", [True, False])
def test_F_LIT_DOOR_FLAGS_inference_mode(inference_mode, tmp_path):
    """Evaluation and prediction run under ``torch.inference_mode()`` by default and under ``torch.no_grad()``
    with ``inference_mode=False``, their start hooks included, in ``fit`` too; training keeps grad on."""
    got = {}
    for name, L in frameworks().items():
        seen = []

        def record(where):
            seen.append((where, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        class M(linear(L.LightningModule)):
            def on_validation_start(self):
                record("on_validation_start")

            def validation_step(self, batch, batch_idx):
                record("validation_step")

            def on_test_start(self):
                record("on_test_start")

            def test_step(self, batch, batch_idx):
                record("test_step")

            def on_predict_start(self):
                record("on_predict_start")

            def predict_step(self, batch, batch_idx):
                record("predict_step")
                return self.layer(batch[0])

            def training_step(self, batch, batch_idx):
                record("training_step")
                return super().training_step(batch, batch_idx)

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), logger=False, enable_checkpointing=False,
                            max_epochs=1, limit_train_batches=1, limit_val_batches=1, limit_test_batches=1,
                            limit_predict_batches=1, num_sanity_val_steps=0, inference_mode=inference_mode,
                            **_quiet())
        model = M()
        trainer.fit(model, data(n=8), data(n=8))
        trainer.validate(model, data(n=8), verbose=False)
        trainer.test(model, data(n=8), verbose=False)
        out = trainer.predict(model, data(n=8))
        got[name] = (seen, out[0].requires_grad, out[0].is_inference())
    assert got["taskfit"] == got["lightning"]
    assert ("test_step", False, inference_mode) in got["taskfit"][0]


@pytest.mark.parametrize("fast_dev_run", [1, 2])
def test_F_LIT_DOOR_FLAGS_fast_dev_run_dummy_logger(fast_dev_run, tmp_path):
    """``fast_dev_run`` puts a ``DummyLogger`` in place of the loggers: ``self.logger.experiment.<anything>()``
    runs and nothing is written; ``max_steps``/``max_epochs``/``val_check_interval`` read as Lightning's."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                self.logger.experiment.dummy_log("some_distribution", torch.randn(3))
                self.logger[0].experiment[0].add_image("x", None)
                self.log("some_metric", 7.0)
                return super().training_step(batch, batch_idx)

        loggers = [_loggers(L).CSVLogger(str(tmp_path / name / "csv"))]
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), fast_dev_run=fast_dev_run, logger=loggers,
                            val_check_interval=2, log_every_n_steps=1, **_quiet())
        trainer.fit(M(), data(n=16))
        lg = trainer.logger
        got[name] = (type(lg).__name__, len(trainer.loggers), lg.name, lg.version, lg.save_dir, trainer.max_steps,
                     trainer.max_epochs, trainer.val_check_interval, trainer.check_val_every_n_epoch,
                     trainer.num_sanity_val_steps, trainer.global_step, (tmp_path / name / "csv").exists())
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][0] == "DummyLogger" and got["taskfit"][-1] is False


class _Clock:
    """A fake ``time.monotonic``: the training batches seen so far, in seconds (the same under both frameworks
    however often each reads the clock)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(("interval", "every", "epochs", "batches"), [
    ("00:00:00:02", 1, 2, 5),
    ({"seconds": 3}, None, 2, 4),
    ("timedelta", 2, 4, 3),
])
def test_F_LIT_DOOR_FLAGS_time_based_val_check_interval(interval, every, epochs, batches, monkeypatch, tmp_path):
    """A time ``val_check_interval`` ("DD:HH:MM:SS", a dict of ``timedelta`` arguments, a ``timedelta``)
    validates after the first batch at which that much time passed since training started or the last
    validation ended, in the epochs ``check_val_every_n_epoch`` allows: the same batches validated, steps and
    weights under both Trainers (one batch = one second of a fake clock)."""
    from datetime import timedelta

    interval = timedelta(seconds=2) if interval == "timedelta" else interval
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    got, weights = {}, {}
    for name, L in frameworks().items():
        validated = []

        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                clock.now += 1.0
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                if batch_idx == 0:
                    validated.append((self.trainer.current_epoch, self.trainer.global_step))

        clock.now = 0.0
        torch.manual_seed(0)
        model = M()
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), logger=False, enable_checkpointing=False,
                            max_epochs=epochs, limit_train_batches=batches, limit_val_batches=1,
                            num_sanity_val_steps=0, val_check_interval=interval, check_val_every_n_epoch=every,
                            **_quiet())
        trainer.fit(model, data(n=4 * batches), data(n=8))
        got[name] = (validated, trainer.global_step)
        weights[name] = [p.detach().clone() for p in model.parameters()]
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][0]
    assert all(torch.equal(a, b) for a, b in zip(weights["taskfit"], weights["lightning"]))


@pytest.mark.parametrize("value", ["00:01:00", "00:00:0x:00"])
def test_F_LIT_DOOR_FLAGS_malformed_time_interval_refused(value, tmp_path):
    """A malformed time ``val_check_interval`` is refused with Lightning's message, before any work."""
    messages = {}
    for name, L in frameworks().items():
        with pytest.raises(Exception) as err:
            L.Trainer(default_root_dir=str(tmp_path / name), val_check_interval=value)
        messages[name] = str(err.value)
    assert messages["taskfit"] == messages["lightning"]
    assert value in messages["taskfit"]


def test_F_LIT_DOOR_possible_user_warning_matches_both_classes():
    """F-LIT-DOOR: with Lightning imported, the door's PossibleUserWarning is caught by ``pytest.warns`` with
    Lightning's class (a Lightning program) and with taskfit's (the import-swapped program) alike."""
    import warnings as _w

    from lightning.fabric.utilities.warnings import PossibleUserWarning as Theirs
    from taskfit.lightning.utilities import PossibleUserWarning as Ours, possible_user_warning

    cls = possible_user_warning()
    assert issubclass(cls, Theirs) and issubclass(cls, Ours) and possible_user_warning() is cls
    for expected in (Theirs, Ours):
        with pytest.warns(expected, match="x"):
            _w.warn("x", cls)
