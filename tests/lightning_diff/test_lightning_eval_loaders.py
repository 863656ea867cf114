"""Differential tests against Lightning: several evaluation loaders given as a list (``dataloader_idx``,
``add_dataloader_idx``), torchmetrics objects logged in ``training_step`` and the refusal of several optimizers under
automatic optimization (scenarios after Lightning's tests_pytorch/trainer/logging_/test_eval_loop_logging.py,
test_train_loop_logging.py and trainer/optimization/test_multiple_optimizers.py)."""

import pytest
import torch
from torch.nn import functional as F

from harness import data, linear, recording_logger, run_lightning, run_taskfit

EVAL_SPEED = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def eval_module(log_on_step=False):
    def make(base):
        class Loaders(linear(base)):
            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                x, y = batch
                loss = F.mse_loss(self.layer(x), y)
                self.log("val_loss", loss)  # val_loss/dataloader_idx_N
                self.log(f"val_own_{dataloader_idx}", loss + dataloader_idx, add_dataloader_idx=False)
                self.log("val_max", loss, reduce_fx="max")
                if log_on_step:
                    self.log("val_both", loss, on_step=True, on_epoch=True)

            def test_step(self, batch, batch_idx, dataloader_idx=0):
                x, y = batch
                self.log("test_loss", F.mse_loss(self.layer(x), y))

            def on_validation_epoch_end(self):
                self.log("val_end", self.layer.weight.sum())  # no suffix: logged outside a loader
        return Loaders
    return make


def _val_loaders():
    return [data(n=8, seed=1), data(n=12, seed=2, batch_size=5)]  # uneven: the mean is weighted by batch size


def _floats(metrics, keep=lambda k: True):
    return {k: float(v) for k, v in metrics.items() if keep(k)}


@pytest.mark.parametrize("log_on_step", [False, True])
def test_F_OBS_6_list_of_eval_loaders_matches_lightning(log_on_step, tmp_path):
    make = eval_module(log_on_step)
    recorder = recording_logger()
    _, tl = run_lightning(make, data(n=12), _val_loaders(), max_epochs=2, logger=recorder)
    _, fit = run_taskfit(make, data(n=12), _val_loaders(), tmp_path=tmp_path, max_epochs=2)
    expected = _floats(tl.callback_metrics)
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1", "val_own_0", "val_own_1", "val_end"} <= set(
        expected)
    assert _floats(fit.callback_metrics, lambda k: k in expected) == pytest.approx(expected, rel=1e-6)
    # what the loggers received at each validation (Lightning's epoch rows; taskfit's evaluation rows)
    user = ("val_",)
    lightning_rows = [{k: v for k, v in r.items() if k.startswith(user) and "_step" not in k}
                      for _, r in recorder.rows]
    lightning_rows = [r for r in lightning_rows if r]
    taskfit_rows = [{k: v for k, v in r.items() if k.startswith(user)} for r in fit.state.log_history]
    taskfit_rows = [r for r in taskfit_rows if r]
    assert len(taskfit_rows) == len(lightning_rows) == 2
    for got, want in zip(taskfit_rows, lightning_rows):
        assert got == pytest.approx(want, rel=1e-6)
    # the loader's own HF values keep apart too
    assert all(f"{k}/dataloader_idx_{i}" in fit.callback_metrics for k in EVAL_SPEED for i in (0, 1))


def test_F_OBS_6_validate_and_test_with_a_list_match_lightning(tmp_path):
    import lightning as L

    make = eval_module()
    module, tl = run_lightning(make, data(n=12), max_epochs=1)
    want_val = tl.validate(module, _val_loaders(), verbose=False)
    want_test = tl.test(module, _val_loaders(), verbose=False)
    assert isinstance(module, L.LightningModule)
    tm, fit = run_taskfit(make, data(n=12), tmp_path=tmp_path, max_epochs=1)
    got_val = fit.validate(tm, _val_loaders())
    got_test = fit.test(tm, _val_loaders())
    # Lightning returns one dict per loader, with the loader's and the loader-free values
    for want, got in ((want_val, got_val), (want_test, got_test)):
        for row in want:
            assert {k: got[k] for k in row} == pytest.approx(row, rel=1e-6)


def test_F_OBS_6_one_name_from_two_loaders_is_refused_as_in_lightning(tmp_path):
    def make(base):
        class Shared(eval_module()(base)):
            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                x, y = batch
                self.log("val_shared", F.mse_loss(self.layer(x), y), add_dataloader_idx=False)
        return Shared

    with pytest.raises(Exception, match="twice in `validation_step` with different arguments"):
        run_lightning(make, data(n=12), _val_loaders())
    with pytest.raises(ValueError, match="add_dataloader_idx=False.*loaders 0 and 1"):
        run_taskfit(make, data(n=12), _val_loaders(), tmp_path=tmp_path)


def test_F_OBS_6_a_one_element_list_is_a_single_loader(tmp_path):
    make = eval_module()
    _, tl = run_lightning(make, data(n=12), [data(n=8, seed=1)])
    _, fit = run_taskfit(make, data(n=12), [data(n=8, seed=1)], tmp_path=tmp_path)
    expected = _floats(tl.callback_metrics)
    assert "val_loss" in expected and not any("dataloader_idx" in k for k in expected)
    assert _floats(fit.callback_metrics, lambda k: k in expected) == pytest.approx(expected, rel=1e-6)


def metric_module(on_epoch):
    def make(base):
        import torchmetrics

        class Metrics(linear(base)):
            def __init__(self):
                super().__init__()
                self.mae = torchmetrics.MeanAbsoluteError()

            def training_step(self, batch, batch_idx):
                x, y = batch
                out = self.layer(x)
                self.mae(out.detach(), y)  # forward: the batch value is the step value
                self.log("mae", self.mae, on_step=True, on_epoch=on_epoch)
                return F.mse_loss(out, y)
        return Metrics
    return make


@pytest.mark.parametrize("on_epoch", [False, True])
def test_F_OBS_6_torchmetrics_in_training_step_logs_step_values_like_lightning(on_epoch, tmp_path):
    make = metric_module(on_epoch)
    recorder = recording_logger()
    _, tl = run_lightning(make, data(n=16), max_epochs=2, logger=recorder, log_every_n_steps=1)
    _, fit = run_taskfit(make, data(n=16), tmp_path=tmp_path, max_epochs=2, log_every_n_steps=1)
    step_key = "mae_step" if on_epoch else "mae"
    want_steps = [r[step_key] for _, r in recorder.rows if step_key in r]
    got_steps = [r[step_key] for r in fit.state.log_history if step_key in r]
    assert len(want_steps) == 8 and got_steps == pytest.approx(want_steps, rel=1e-6)
    want_epochs = [r["mae_epoch"] for _, r in recorder.rows if "mae_epoch" in r]
    got_epochs = [r["mae_epoch"] for r in fit.state.log_history if "mae_epoch" in r]
    assert len(want_epochs) == (2 if on_epoch else 0) and got_epochs == pytest.approx(want_epochs, rel=1e-6)
    expected = _floats(tl.callback_metrics)
    assert _floats(fit.callback_metrics, lambda k: k in expected) == pytest.approx(expected, rel=1e-6)


def test_F_LOOP_4_two_optimizers_under_automatic_optimization_are_refused_as_in_lightning(tmp_path):
    def make(base):
        class Two(base):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                return F.mse_loss(self.a(x) + self.b(x), y)

            def configure_optimizers(self):
                return [torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)]
        return Two

    pattern = "multiple optimizers is only supported with manual optimization.*automatic_optimization = False"
    with pytest.raises(RuntimeError, match=pattern):
        run_lightning(make, data())
    with pytest.raises(RuntimeError, match=pattern):
        run_taskfit(make, data(), tmp_path=tmp_path)


def test_F_OBS_6_loaders_from_the_module_and_a_datamodule_match_lightning(tmp_path):
    """``val_dataloader()`` returning a list, defined on the module (Lightning's module hooks) or on a
    DataModule: the same callback metrics as Lightning."""
    import lightning as L

    from taskfit import DataModule

    def with_loaders(base):
        class OwnLoaders(eval_module()(base)):
            def train_dataloader(self):
                return data(n=12)

            def val_dataloader(self):
                return _val_loaders()
        return OwnLoaders

    _, tl = run_lightning(with_loaders, None, max_epochs=1)
    expected = _floats(tl.callback_metrics)
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"} <= set(expected)
    _, fit = run_taskfit(with_loaders, None, tmp_path=tmp_path / "module", max_epochs=1,
                         fit_options={"eval_strategy": "epoch"})
    assert _floats(fit.callback_metrics, lambda k: k in expected) == pytest.approx(expected, rel=1e-6)

    def datamodule(base):
        class Data(base):
            def train_dataloader(self):
                return data(n=12)

            def val_dataloader(self):
                return _val_loaders()
        return Data()

    module, tl = run_lightning(eval_module(), None, max_epochs=1, fit_kwargs={"datamodule": datamodule(
        L.LightningDataModule)})
    _, fit = run_taskfit(eval_module(), None, tmp_path=tmp_path / "dm", max_epochs=1,
                         fit_options={"eval_strategy": "epoch"}, fit_kwargs={"datamodule": datamodule(DataModule)})
    expected = _floats(tl.callback_metrics)
    assert _floats(fit.callback_metrics, lambda k: k in expected) == pytest.approx(expected, rel=1e-6)
