"""The Lightning door as an import swap: the same script run with ``import lightning as L`` and with
``import taskfit.lightning as L`` (only the import differs) gives the same weights, step counts, epochs and
return values (F-LIT-DOOR)."""

import warnings

import pytest
import torch
from torch.nn import functional as F

from harness import data, linear, same_weights
from two_doors import frameworks, with_evaluation


def script(L, make, tmp_path, calls=None, stages=("fit",), **flags):
    """The user's script with ``L`` as its ``lightning`` import: build the module, a Trainer with ``flags``
    (Lightning's defaults otherwise, progress bar off, files under ``tmp_path``), run ``stages``."""
    torch.manual_seed(0)
    module = make(L.LightningModule)()
    trainer = L.Trainer(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False,
                        **flags)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for stage in stages:
            if stage == "fit":
                trainer.fit(module, data(), data())
            else:
                out[stage] = getattr(trainer, stage)(module, data())
    return module, trainer, out


def evaluating(base_make):
    def make(base):
        class M(with_evaluation(base_make)(base)):
            def predict_step(self, batch, batch_idx):
                return self.layer(batch[0])

            def forward(self, x):
                return self.layer(x)

            def on_fit_end(self):
                self.epoch_at_fit_end = self.current_epoch
        return M
    return make


def both(make, tmp_path, **kw):
    return {name: script(L, make, tmp_path / name, **kw) for name, L in frameworks().items()}


def test_F_LIT_DOOR_1_defaults_fit_validate_test_predict_match(tmp_path):
    """Lightning's defaults (no clipping, validation every epoch, checkpoint per epoch under
    lightning_logs/version_0/checkpoints): same weights bitwise, global_step, current_epoch at on_fit_end and
    after, validate/test dicts without eval_/test_ prefixes, predict's list of batch outputs."""
    r = both(evaluating(linear), tmp_path, stages=("fit", "validate", "test", "predict"), max_epochs=2,
             logger=False)
    (ml, tl, ol), (mt, tt, ot) = r["lightning"], r["taskfit"]
    assert same_weights(ml, mt)
    assert (tt.global_step, tt.current_epoch, mt.epoch_at_fit_end) == (tl.global_step, tl.current_epoch,
                                                                       ml.epoch_at_fit_end) == (8, 2, 2)
    assert ot["validate"] == ol["validate"] and ot["test"] == ol["test"]
    assert len(ot["predict"]) == len(ol["predict"]) == 4
    assert all(torch.equal(a, b) for a, b in zip(ol["predict"], ot["predict"]))
    assert tt.checkpoint_callback.dirpath.endswith("checkpoints")


def test_F_LIT_DOOR_2_max_epochs_and_max_steps_whichever_first(tmp_path):
    """max_epochs=2 with max_steps=100 stops after 2 epochs (8 steps); max_epochs=3 with max_steps=5 at 5."""
    for flags, steps in ((dict(max_epochs=2, max_steps=100), 8), (dict(max_epochs=3, max_steps=5), 5)):
        r = both(evaluating(linear), tmp_path / str(steps), logger=False, enable_checkpointing=False, **flags)
        (ml, tl, _), (mt, tt, _) = r["lightning"], r["taskfit"]
        assert tt.global_step == tl.global_step == steps
        assert tt.current_epoch == tl.current_epoch
        assert same_weights(ml, mt)


def test_F_LIT_DOOR_3_steps_called_by_their_signature(tmp_path):
    """training_step(self, batch) and validation_step(self, batch) without batch_idx are valid Lightning."""
    def make(base):
        class M(evaluating(linear)(base)):
            def training_step(self, batch):
                x, y = batch
                return F.mse_loss(self.layer(x), y)

            def validation_step(self, batch):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y))
        return M

    r = both(make, tmp_path, stages=("fit", "validate"), max_epochs=1, logger=False, enable_checkpointing=False)
    (ml, _, ol), (mt, _, ot) = r["lightning"], r["taskfit"]
    assert same_weights(ml, mt)
    assert ot["validate"] == ol["validate"]


def test_F_LIT_DOOR_4_logger_false_values_in_callback_metrics(tmp_path):
    """self.log(..., logger=False) values are in trainer.callback_metrics (Lightning's), with no log step in the
    run (log_every_n_steps=50 > 4 steps): the last step's value."""
    def make(base):
        class M(evaluating(linear)(base)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("hidden", loss * 2, logger=False)
                return loss
        return M

    r = both(make, tmp_path, max_epochs=1, logger=False, enable_checkpointing=False)
    assert float(r["taskfit"][1].callback_metrics["hidden"]) == float(r["lightning"][1].callback_metrics["hidden"])


def test_F_LIT_DOOR_5_setup_teardown_stages_match(tmp_path):
    """setup(stage)/teardown(stage) of the module run for fit, validate, test and predict, as in Lightning."""
    def make(base):
        class M(evaluating(linear)(base)):
            def setup(self, stage):
                self.__dict__.setdefault("seen", []).append(("setup", stage))

            def teardown(self, stage):
                self.__dict__.setdefault("seen", []).append(("teardown", stage))
        return M

    r = both(make, tmp_path, stages=("fit", "validate", "test", "predict"), max_epochs=1, logger=False,
             enable_checkpointing=False)
    assert r["taskfit"][0].seen == r["lightning"][0].seen


@pytest.mark.parametrize("flag, value", [("benchmark", True), ("sync_batchnorm", True)])
def test_F_LIT_DOOR_6_unsupported_flag_fails_first_naming_it(flag, value, tmp_path):
    import taskfit.lightning as L

    with pytest.raises(NotImplementedError, match=flag):
        L.Trainer(default_root_dir=str(tmp_path), **{flag: value})
    assert not any(tmp_path.iterdir())  # nothing was written


def test_F_LIT_DOOR_7_trainer_attributes(tmp_path):
    """The trainer seen by callbacks has Lightning's public attributes, with Lightning's values."""
    seen = {}
    names = ("current_epoch", "global_step", "max_epochs", "max_steps", "is_global_zero", "num_training_batches",
             "estimated_stepping_batches", "precision", "training", "sanity_checking", "log_every_n_steps")

    def grab(key):
        def hook(trainer, pl_module):
            seen.setdefault(key, []).append({n: getattr(trainer, n) for n in names})
        return hook

    for name, L in frameworks().items():
        cb = L.pytorch.callbacks.LambdaCallback(on_train_epoch_end=grab(name)) if name == "lightning" else \
            L.callbacks.LambdaCallback(on_train_epoch_end=grab(name))
        script(L, evaluating(linear), tmp_path / name, max_epochs=2, logger=False, enable_checkpointing=False,
               callbacks=[cb])
    assert seen["taskfit"] == seen["lightning"]


def _csv_rows(root):
    import csv
    import glob

    (path,) = glob.glob(str(root / "**" / "metrics.csv"), recursive=True)
    with open(path) as f:
        return [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(f)]


def _with_csv(L, name, root):
    import lightning

    return (lightning.pytorch.loggers if name == "lightning" else L.loggers).CSVLogger(str(root))


def test_F_LIT_DOOR_8_validation_keys_without_eval_prefix(tmp_path):
    """Names logged in validation_step during fit ("acc", no stage prefix) keep their names in callback_metrics
    and in the logger's rows (Lightning adds no eval_ prefix; Fit keeps HF's eval_ prefix); the evaluation's speed
    figures are not logged."""
    def make(base):
        class M(evaluating(linear)(base)):
            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("acc", F.l1_loss(self.layer(x), y))
                self.log("val_loss", F.mse_loss(self.layer(x), y))
        return M

    got = {}
    for name, L in frameworks().items():
        _, trainer, _ = script(L, make, tmp_path / name, max_epochs=2, enable_checkpointing=False,
                               logger=_with_csv(L, name, tmp_path / name), log_every_n_steps=1)
        rows = [r for r in _csv_rows(tmp_path / name) if "acc" in r]
        got[name] = ({k: float(trainer.callback_metrics[k]) for k in ("acc", "val_loss")},
                     [v for r in rows for v in (r["acc"], r["val_loss"])], set().union(*rows))
    (cm_l, rows_l, _), (cm_t, rows_t, keys_t) = got["lightning"], got["taskfit"]
    assert cm_t == pytest.approx(cm_l, rel=1e-6)
    assert len(rows_t) == len(rows_l) == 4 and rows_t == pytest.approx(rows_l, rel=1e-6)
    assert not any(k.startswith(("eval_", "_")) or k.endswith("_runtime") for k in keys_t)

    # Fit (HF semantics) keeps the eval_ prefix
    from harness import run_taskfit

    _, fit = run_taskfit(make, data(), data(), tmp_path=tmp_path / "fit", max_epochs=1)
    assert "eval_acc" in fit.callback_metrics and "acc" not in fit.callback_metrics


def manual_without_loss(base):
    class M(linear(base)):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            x, y = batch
            loss = F.mse_loss(self.layer(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.log("mine", loss)
    return M


def test_F_LIT_DOOR_9_manual_optimization_without_loss_logs_no_loss(tmp_path):
    """A manual-optimization training_step returning nothing: no "loss" row value and no "train_loss" (Lightning
    logs only what it is given, not a fake 0.0); the user's own values are logged as under Lightning, and the
    weights match bitwise."""
    got = {}
    for name, L in frameworks().items():
        module, trainer, _ = script(L, manual_without_loss, tmp_path / name, max_epochs=2,
                                    enable_checkpointing=False, logger=_with_csv(L, name, tmp_path / name),
                                    log_every_n_steps=1)
        rows = _csv_rows(tmp_path / name)
        got[name] = module, [r["mine"] for r in rows if "mine" in r], set().union(*rows), trainer
    (ml, mine_l, _, tl), (mt, mine_t, keys_t, tt) = got["lightning"], got["taskfit"]
    assert same_weights(ml, mt)
    assert mine_t == pytest.approx(mine_l, rel=1e-6) and len(mine_t) == 8
    assert "loss" not in keys_t and "train_loss" not in keys_t
    assert "loss" not in tt.callback_metrics and "train_loss" not in tt.callback_metrics
    assert float(tt.callback_metrics["mine"]) == pytest.approx(float(tl.callback_metrics["mine"]), rel=1e-6)


def test_F_LIT_DOOR_10_manual_optimization_returned_loss_still_logged(tmp_path):
    """A manual-optimization training_step that returns its loss keeps Fit's running "loss" and "train_loss"
    (their mean over the steps), so only the fake 0.0 is gone."""
    from harness import run_taskfit

    def make(base):
        class M(manual_without_loss(base)):
            def training_step(self, batch, batch_idx):
                super().training_step(batch, batch_idx)
                x, y = batch
                return F.mse_loss(self.layer(x), y).detach()
        return M

    _, fit = run_taskfit(make, data(), tmp_path=tmp_path, max_epochs=1, log_every_n_steps=1)
    rows = [r for r in fit.state.log_history if "loss" in r]
    assert len(rows) == 4 and all(r["loss"] > 0 for r in rows)
    summary = fit.state.log_history[-1]
    assert summary["train_loss"] == pytest.approx(sum(r["loss"] for r in rows) / 4, rel=1e-6)


def test_F_LIT_DOOR_11_callback_and_logger_imports_swap_line_for_line():
    """``from lightning.pytorch.callbacks import X`` and ``...loggers import X`` have a one-line swap: the
    namespaces are modules, and each name is the built-in Lightning users know."""
    import importlib

    from lightning.pytorch import callbacks as pl_callbacks
    from lightning.pytorch import loggers as pl_loggers

    tf_callbacks = importlib.import_module("taskfit.lightning.callbacks")
    tf_loggers = importlib.import_module("taskfit.lightning.loggers")
    for name in ("ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "TQDMProgressBar", "LambdaCallback",
                 "ModelSummary", "Timer", "StochasticWeightAveraging", "Callback"):
        assert hasattr(pl_callbacks, name) and hasattr(tf_callbacks, name), name
    for name in ("CSVLogger", "TensorBoardLogger", "MLFlowLogger", "WandbLogger"):
        assert hasattr(pl_loggers, name) and hasattr(tf_loggers, name), name
    from taskfit.lightning.callbacks import EarlyStopping
    from taskfit.lightning.loggers import CSVLogger

    assert EarlyStopping(monitor="val_loss", patience=2).patience == 2
    assert CSVLogger("root", name="exp").name == "exp"
