"""Differential tests against Lightning: what self.log puts into callback_metrics (scenarios after Lightning's
tests_pytorch/trainer/logging_/test_train_loop_logging.py and test_eval_loop_logging.py)."""

import pytest
from torch.nn import functional as F

from harness import data, linear, run_lightning, run_taskfit


def logging_module(where):
    def make(base):
        class Logs(linear(base)):
            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = F.mse_loss(self.layer(x), y)
                if where == "step_and_epoch":
                    self.log("metric", loss, on_step=True, on_epoch=True)
                if where == "epoch_only":
                    self.log("metric", loss, on_step=False, on_epoch=True)
                if where == "logger_false":
                    self.log("metric", loss, on_step=False, on_epoch=True, logger=False)
                if where == "sum_reduce":
                    self.log("metric", float(batch_idx), on_step=False, on_epoch=True, reduce_fx="sum")
                if where == "max_reduce":
                    self.log("metric", loss, on_step=False, on_epoch=True, reduce_fx="max")
                return loss

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y))

            def on_train_epoch_end(self):
                if where == "train_epoch_end":
                    self.log("metric", float(self.current_epoch) + 0.5)

            def on_validation_epoch_end(self):
                if where == "validation_epoch_end":
                    self.log("metric", self.layer.weight.sum())
        return Logs
    return make


CASES = ("step_and_epoch", "epoch_only", "logger_false", "sum_reduce", "max_reduce", "train_epoch_end",
         "validation_epoch_end")


@pytest.mark.parametrize("where", CASES)
def test_F_OBS_6_callback_metrics_match_lightning(where, tmp_path):
    make = logging_module(where)
    _, tl = run_lightning(make, data(n=12), data(n=8, seed=1), max_epochs=2)
    _, fit = run_taskfit(make, data(n=12), data(n=8, seed=1), tmp_path=tmp_path, max_epochs=2)
    expected = {k: float(v) for k, v in tl.callback_metrics.items()}
    assert "metric" in expected or "metric_epoch" in expected
    # documented prefix rule: a name logged during evaluation without a stage prefix (val_, eval_, test_) gets
    # eval_ during fit/validate (test_ during test)
    rename = {"metric": "eval_metric"} if where == "validation_epoch_end" else {}
    got = {k: float(fit.callback_metrics[rename.get(k, k)]) for k in expected
           if rename.get(k, k) in fit.callback_metrics}
    assert got == pytest.approx(expected, rel=1e-6)
