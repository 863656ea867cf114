"""Configuration errors and the hooks that may log, under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``:
the same ``MisconfigurationException`` (caught by Lightning's class and by ``taskfit.lightning``'s), the same
message; ``self.log`` refused in the same hooks with the same words (F-LIT-9, F-LIT-5)."""

import warnings

import pytest
import torch
from harness import data, linear
from lightning.pytorch.utilities.exceptions import MisconfigurationException as TheirMisconfiguration
from two_doors import callbacks_of, frameworks


def _quiet_trainer(L, tmp_path, **kwargs):
    return L.Trainer(default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, **kwargs)


def _raised(make, L):
    """``(class is Lightning's MisconfigurationException, message)`` of what ``make(L)`` raises."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as err:
            make(L)
    return isinstance(err.value, TheirMisconfiguration), str(err.value)


def _bad_optimizers(L):
    class BadOptimizers(linear(L.LightningModule)):
        def configure_optimizers(self):
            return "sgd"
    return BadOptimizers


def _log_nothing(L):
    class LogsNothing(linear(L.LightningModule)):
        def training_step(self, batch, batch_idx):
            self.log("loss", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)
    return LogsNothing


def test_F_LIT_DOOR_misconfiguration_class_and_message_like_lightning(tmp_path):
    """Four misconfigurations (a callback's constructor, a Trainer flag, ``configure_optimizers``' result during
    ``fit``, a ``self.log`` call in ``training_step``): both doors raise an exception of Lightning's
    ``MisconfigurationException`` class with the same message; taskfit's is also ``taskfit.lightning.
    MisconfigurationException`` and a ``ValueError``, and a user's own ``ValueError`` stays what it was."""
    import taskfit.lightning

    cases = {
        "top_k": lambda L: callbacks_of(L).ModelCheckpoint(dirpath=str(tmp_path), save_top_k=-3),
        "mode": lambda L: callbacks_of(L).EarlyStopping(monitor="val_loss", mode="maximum"),
        "interval": lambda L: L.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None, logger=False),
        "optimizers": lambda L: _quiet_trainer(L, tmp_path / L.__name__, max_steps=1).fit(_bad_optimizers(L)(),
                                                                                           data(n=4)),
        "log": lambda L: _quiet_trainer(L, tmp_path / L.__name__, max_steps=1).fit(_log_nothing(L)(), data(n=4)),
    }
    got = {name: {key: _raised(make, L) for key, L in frameworks().items()} for name, make in cases.items()}
    for name, both in got.items():
        assert both["taskfit"] == both["lightning"], name
        assert both["taskfit"][0], name
    with pytest.raises(taskfit.lightning.MisconfigurationException) as err:
        callbacks_of(taskfit.lightning).ModelCheckpoint(dirpath=str(tmp_path), save_top_k=-3)
    assert isinstance(err.value, ValueError)

    class OwnError(linear(taskfit.lightning.LightningModule)):
        def training_step(self, batch, batch_idx):
            raise ValueError("the user's own")
    with pytest.raises(ValueError, match="the user's own") as err:
        _quiet_trainer(taskfit.lightning, tmp_path / "own", max_steps=1).fit(OwnError(), data(n=4))
    assert not isinstance(err.value, (TheirMisconfiguration, taskfit.lightning.MisconfigurationException))


def _refusals(L, tmp_path):
    """What ``self.log`` does in each hook of a short fit, test and predict: ``{hook: "ok" | (Lightning's class?,
    message)}``, from the module's hooks and from a callback's."""
    seen = {}

    def attempt(hook, module, **kwargs):
        try:
            module.log(hook, 1.0, **kwargs)
            seen[hook] = "ok"
        except Exception as e:  # noqa: BLE001 (the class is what is compared)
            seen[hook] = (isinstance(e, TheirMisconfiguration), str(e))

    class Logging(linear(L.LightningModule)):
        def setup(self, stage):
            attempt(f"setup:{getattr(stage, 'value', stage)}", self)  # Lightning: a TrainerFn

        def configure_optimizers(self):
            attempt("configure_optimizers", self)
            return super().configure_optimizers()

        def on_train_epoch_end(self):
            attempt("on_train_epoch_end(on_step=True)", self, on_step=True)

        def on_train_batch_start(self, batch, batch_idx):
            attempt("on_train_batch_start", self)

        def test_step(self, batch, batch_idx):
            attempt("test_step", self)

        def predict_step(self, batch, batch_idx):
            attempt("predict_step", self)
            return self.layer(batch[0])

    class CallbackLogging(L.Callback):
        def on_fit_start(self, trainer, module):
            attempt("callback on_fit_start", module)

        def on_train_end(self, trainer, module):
            attempt("callback on_train_end", module)

        def on_save_checkpoint(self, trainer, module, checkpoint):
            attempt("callback on_save_checkpoint", module)

    torch.manual_seed(0)
    model = Logging()
    with pytest.warns(UserWarning, match="`self.trainer` reference is not registered"):
        model.log("no trainer", 1.0)
    trainer = L.Trainer(default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=2, callbacks=[CallbackLogging()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data(n=8))
        trainer.test(model, data(n=4), verbose=False)
        trainer.predict(model, data(n=4))
    return seen


def test_F_LIT_LOG_hooks_that_cannot_log_like_lightning(tmp_path):
    """``self.log`` in ``setup``, ``configure_optimizers``, a callback's ``on_fit_start``/``on_train_end``/
    ``on_save_checkpoint``, with ``on_step=True`` in ``on_train_epoch_end``, and in ``predict``: refused with
    Lightning's ``MisconfigurationException`` and words under both doors; allowed in ``on_train_batch_start`` and
    ``test_step``; a module no trainer holds warns."""
    got = {key: _refusals(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"]["on_train_batch_start"] == "ok" and got["taskfit"]["test_step"] == "ok"
    refused = {k: v for k, v in got["taskfit"].items() if v != "ok"}
    assert set(refused) == {"setup:fit", "setup:test", "setup:predict", "configure_optimizers",
                            "on_train_epoch_end(on_step=True)", "callback on_fit_start", "callback on_train_end",
                            "callback on_save_checkpoint", "predict_step"}
    assert all(is_theirs for is_theirs, _ in refused.values())
    assert "You can't `self.log()` inside `setup`" in refused["setup:fit"][1]
    assert "must be one of (False,)" in refused["on_train_epoch_end(on_step=True)"][1]
    assert "result collection is not registered yet" in refused["predict_step"][1]
