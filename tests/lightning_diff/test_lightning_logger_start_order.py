"""When the loggers get Lightning's start calls (``log_hyperparams``, ``log_graph``, ``save``) relative to the
module's and the callbacks' hooks: one list of hook calls and logger calls per trainer method (``fit`` with
validation, ``validate``, ``test``, ``predict``) equal under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from harness import data, linear, regression
from two_doors import frameworks

_MODULE_HOOKS = ("setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start",
                 "on_sanity_check_start", "on_validation_start", "on_test_start", "on_predict_start", "on_fit_end",
                 "teardown", "on_train_epoch_start", "on_validation_model_eval")
_CALLBACK_HOOKS = ("setup", "on_fit_start", "on_train_start", "on_sanity_check_start", "on_validation_start",
                   "on_test_start", "on_predict_start", "on_fit_end", "teardown")


def _run(L, root, method):
    from lightning.pytorch.loggers import Logger

    calls = []

    class Recorder(Logger):
        name, version = "rec", 0

        def log_metrics(self, metrics, step=None):
            pass

        def log_hyperparams(self, params, *args, **kwargs):
            calls.append("logger.log_hyperparams")

        def log_graph(self, model, input_array=None):
            calls.append("logger.log_graph")

        def save(self):
            calls.append("logger.save")

    def recorder(prefix, name):
        def hook(self, *args, **kwargs):
            calls.append(f"{prefix}.{name}")
            parent = getattr(super(type(self), self), name, None)
            return parent(*args, **kwargs) if prefix == "module" and parent is not None else None
        return hook

    base = linear(L.LightningModule)

    class M(base):
        def __init__(self, lr=0.1):
            super().__init__()
            self.save_hyperparameters()

        def validation_step(self, batch, batch_idx):
            self.log("v", float(batch_idx))

        def test_step(self, batch, batch_idx):
            self.log("t", float(batch_idx))

        def predict_step(self, batch, batch_idx):
            return batch[0].sum()

    for name in _MODULE_HOOKS:
        own = M.__dict__.get(name) or getattr(base, name, None)

        def hook(self, *args, _name=name, _own=own, **kwargs):
            calls.append(f"module.{_name}")
            return _own(self, *args, **kwargs) if _own is not None else None
        setattr(M, name, hook)
    C = type("C", (L.Callback,), {n: recorder("callback", n) for n in _CALLBACK_HOOKS})
    trainer = L.Trainer(default_root_dir=str(root), max_epochs=1, accelerator="cpu", devices=1, logger=Recorder(),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, callbacks=[C()])
    torch.manual_seed(0)
    module = M()
    loader = DataLoader(regression(4), batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "fit":
            trainer.fit(module, data(n=8), loader)
        elif method == "predict":
            trainer.predict(module, loader)
        else:
            getattr(trainer, method)(module, loader, verbose=False)
    return calls


@pytest.mark.parametrize("method", ["fit", "validate", "test", "predict"])
def test_F_LIT_LOG_logger_start_calls_in_lightnings_order(tmp_path, method):
    """F-LIT-DOOR: ``log_hyperparams``/``log_graph``/``save`` come where Lightning makes them (``fit``: after the
    callbacks' and the module's ``on_fit_start``; ``validate``/``test``/``predict``: after ``setup`` and
    ``configure_optimizers``-free set-up, before the stage's start hooks)."""
    got = {name: _run(L, tmp_path / name, method) for name, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert "logger.log_hyperparams" in got["lightning"]
