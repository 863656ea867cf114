"""``self.log`` where Lightning refuses it, ``CSVLogger`` re-opening a version folder and ``LambdaCallback`` built
from every member of ``Callback``, under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``: the same
``MisconfigurationException`` class and words, the same files, the same hooks called (F-LIT-5, F-LIT-9, F-LIT-3)."""

import csv
import functools
import inspect
import warnings

import pytest
import torch
from harness import data, linear
from lightning.pytorch.utilities.exceptions import MisconfigurationException as TheirMisconfiguration
from torch.utils.data import DataLoader, Dataset
from two_doors import callbacks_of, frameworks


def _trainer(L, tmp_path, **kwargs):
    return L.Trainer(default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, **kwargs)


def _outcome(fn):
    """``"ok"`` or ``(is Lightning's MisconfigurationException, message)`` of calling ``fn``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as e:  # noqa: BLE001 (the class is what is compared)
        return isinstance(e, TheirMisconfiguration), str(e)
    return "ok"


class _LoggingData(Dataset):
    """Four ``(x, y)`` samples; ``__getitem__`` calls ``module.log`` (code the trainer runs outside any hook)."""

    def __init__(self, module):
        self.module, self.base, self.seen = module, data(n=4, batch_size=1).dataset, []

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        self.seen.append(_outcome(lambda: self.module.log("in_getitem", 1.0)))
        return self.base[i]


def _outside_hooks(L, tmp_path):
    class Helper(linear(L.LightningModule)):
        def scaled(self, loss):  # the user's own method, called from training_step: logs as training_step
            self.log("helper", loss * 2)
            return loss

        def training_step(self, batch, batch_idx):
            return self.scaled(super().training_step(batch, batch_idx))

    torch.manual_seed(0)
    model = Helper()
    ds = _LoggingData(model)
    trainer = _trainer(L, tmp_path, max_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(ds, batch_size=2))
    return {"getitem": ds.seen[0], "after fit": _outcome(lambda: model.log("after", 1.0)),
            "helper": round(float(trainer.callback_metrics["helper"]), 6)}


def test_F_LIT_LOG_outside_the_trainer_control_flow_like_lightning(tmp_path):
    """``self.log`` from a data set's ``__getitem__`` while ``fit`` trains (no hook running): Lightning's "not
    managed by the `Trainer` control flow"; after ``fit`` returned: "result collection is not registered"; from
    the user's own method called by ``training_step``: logged, the same value. Both doors alike."""
    got = {key: _outside_hooks(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"]["getitem"] == (True, "You are trying to `self.log()` but it is not managed by the "
                                                "`Trainer` control flow")
    assert got["taskfit"]["after fit"][0] and "result collection is not registered" in got["taskfit"]["after fit"][1]


def _metric_cases(L, tmp_path):
    torchmetrics = pytest.importorskip("torchmetrics")

    def make(hold, attribute=None):
        class Metrics(linear(L.LightningModule)):
            def __init__(self):
                super().__init__()
                if hold:
                    self.held = torchmetrics.MeanMetric()

            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                metric = self.held if hold and attribute != "loose" else torchmetrics.MeanMetric()
                metric(loss.detach())
                kwargs = {"metric_attribute": "held"} if attribute == "given" else {}
                self.log("m", metric, **kwargs)
                return loss
        return Metrics

    out = {}
    for case, (hold, attribute) in {"none held": (False, None), "another held": (True, "loose"),
                                     "held": (True, None), "attribute given": (True, "given")}.items():
        torch.manual_seed(0)
        model, trainer = make(hold, attribute)(), _trainer(L, tmp_path / case, max_steps=2)
        out[case] = _outcome(lambda: trainer.fit(model, data(n=8)))
        if out[case] == "ok":
            out[case] = round(float(trainer.callback_metrics["m"]), 6)
    return out


def test_F_LIT_LOG_metric_not_held_by_the_module_refused_like_lightning(tmp_path):
    """``self.log("m", metric)`` with a ``torchmetrics.Metric`` the module does not hold: refused with Lightning's
    words (the module holds none / holds another, named); a held one, or one named by ``metric_attribute=``,
    logs the same value under both doors."""
    got = {key: _metric_cases(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"]["none held"][0] and "setting an attribute for the metric" in got["taskfit"]["none held"][1]
    assert "where `name` is one of ['held']" in got["taskfit"]["another held"][1]
    assert isinstance(got["taskfit"]["held"], float)


def _repeated(L, tmp_path):
    class Twice(linear(L.LightningModule)):
        def training_step(self, batch, batch_idx):
            self.log("foo", 1.0, prog_bar=False)
            self.log("foo", 2.0, prog_bar=self.change)
            return super().training_step(batch, batch_idx)

    class Argmax(linear(L.LightningModule)):
        def training_step(self, batch, batch_idx):
            self.log("foo", 1.0, reduce_fx=torch.argmax)
            return super().training_step(batch, batch_idx)

    out = {}
    for case, cls, change in (("changed", Twice, True), ("same", Twice, False), ("argmax", Argmax, None)):
        torch.manual_seed(0)
        model = cls()
        model.change = change
        trainer = _trainer(L, tmp_path / case, max_steps=2)
        out[case] = _outcome(lambda: trainer.fit(model, data(n=8)))
        if out[case] == "ok":
            out[case] = float(trainer.callback_metrics["foo"])
        elif case == "argmax":  # Lightning's words up to the reduction it found (printed differently)
            out[case] = (out[case][0], out[case][1].split(" Found:")[0])
    return out


def test_F_LIT_LOG_name_logged_twice_with_other_options_like_lightning(tmp_path):
    """The same name logged twice in ``training_step`` with another ``prog_bar``: Lightning's "twice in
    `training_step` with different arguments"; with the same options: the last value; ``reduce_fx=torch.argmax``:
    Lightning's "Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported"."""
    got = {key: _repeated(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"]["changed"] == (True, "You called `self.log(foo, ...)` twice in `training_step` with "
                                              "different arguments. This is not allowed")
    assert got["taskfit"]["same"] == 2.0


def _reopened_csv(L, tmp_path):
    folder = tmp_path / "exp" / "version_0"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text("step,old\n0,1.0\n")
    (folder / "notes.txt").write_text("kept")
    logger = callbacks_of(L).__name__.replace("callbacks", "loggers")
    import importlib

    logger = importlib.import_module(logger).CSVLogger(save_dir=str(tmp_path), name="exp", version=0)
    existed = (folder / "metrics.csv").exists()
    with pytest.warns(UserWarning, match="exists and is not empty") as record:
        _ = logger.experiment
    message = next(str(w.message) for w in record if "exists and is not empty" in str(w.message))
    deleted = not (folder / "metrics.csv").exists()
    logger.log_metrics({"a": 1.0, "b": 2.0}, step=3)
    logger.save()
    with open(folder / "metrics.csv", newline="") as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return existed, message.replace(str(tmp_path), "<tmp>"), deleted, rows, sorted(p.name for p in folder.iterdir())


def test_F_LIT_LOG_csv_version_folder_reopened_like_lightning(tmp_path):
    """``CSVLogger(save_dir, name, version=0)`` over a folder holding an earlier ``metrics.csv``: on first use
    Lightning's warning, the old file deleted (other files kept), the new rows alone in a new file."""
    got = {key: _reopened_csv(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][2] and got["taskfit"][3] == [{"a": 1.0, "b": 2.0, "step": 3.0}]


def _lambda_hooks(L, tmp_path):
    members = {n for n, _ in inspect.getmembers(L.Callback, predicate=inspect.isfunction) if not n.startswith("_")}
    hooks = members - {"state_dict", "load_state_dict"}
    called = set()

    def call(hook, *_, **__):
        called.add(hook)

    class Evaluated(linear(L.LightningModule)):
        def validation_step(self, batch, batch_idx):
            self.log("v", 1.0)

        def test_step(self, batch, batch_idx):
            self.log("t", 1.0)

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

    torch.manual_seed(0)
    model = Evaluated()
    trainer = L.Trainer(default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                        enable_model_summary=False, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                        callbacks=[callbacks_of(L).LambdaCallback(**{h: functools.partial(call, h) for h in hooks})])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data(n=8), data(n=4))
        trainer.test(model, data(n=4), verbose=False)
        trainer.predict(model, data(n=4))
    return members, called


def test_F_LIT_CB_lambda_callback_of_every_callback_member_like_lightning(tmp_path):
    """``taskfit.lightning.Callback`` has Lightning's members only (``taskfit.Callback`` adds the Hugging Face
    hooks), so a ``LambdaCallback`` of every member sees the same hooks called in a fit, test and predict."""
    import taskfit

    got = {key: _lambda_hooks(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert issubclass(taskfit.Callback, taskfit.lightning.Callback) and hasattr(taskfit.Callback, "on_log")
    assert not hasattr(taskfit.lightning.Callback, "on_log")


def _resumed_past_max_epochs(L, tmp_path):
    import glob

    torch.manual_seed(0)
    M = linear(L.LightningModule)
    checkpoints = callbacks_of(L).ModelCheckpoint(dirpath=str(tmp_path), save_top_k=-1)
    trainer = L.Trainer(default_root_dir=str(tmp_path), max_epochs=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[checkpoints])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(M(), data(n=4))
    out = {}
    for epoch in (1, 2):
        path = glob.glob(str(tmp_path / f"epoch={epoch}-*.ckpt"))[0]
        again = _trainer(L, tmp_path / f"again{epoch}", max_epochs=1)
        out[epoch] = _outcome(lambda: again.fit(M(), data(n=4), ckpt_path=path))
        if out[epoch] == "ok":
            out[epoch] = (again.current_epoch, again.global_step)
    return out


def test_F_LIT_CKPT_resume_past_max_epochs_refused_like_lightning(tmp_path):
    """``fit(ckpt_path=)`` with a checkpoint saved in epoch 2 under ``max_epochs=1``: Lightning's "You restored a
    checkpoint with current_epoch=2, but you have set Trainer(max_epochs=1)"; one saved in epoch 1 resumes and
    trains nothing more. Both doors alike."""
    got = {key: _resumed_past_max_epochs(L, tmp_path / key) for key, L in frameworks().items()}
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][2] == (True, "You restored a checkpoint with current_epoch=2, but you have set "
                                       "Trainer(max_epochs=1).")
