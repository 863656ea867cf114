"""F-CORE-4 / F-EVAL-2: the errors a new user meets first. ``metric_for_best_model`` that no evaluation can
produce fails before training when that is knowable, else at the first evaluation naming the metrics that exist."""

from __future__ import annotations

import pytest
from helpers.models import HFClassifier, hf_rows
from taskfit import Fit, TaskModule
from torch import nn


class Logged(TaskModule):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.linear(batch["x"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        logits = self.linear(batch["x"])
        self.log("val_acc", (logits.argmax(-1) == batch["labels"]).float().mean())
        return nn.functional.cross_entropy(logits, batch["labels"])


def _fit(tmp_path, **kw):
    return Fit(output_dir=str(tmp_path), max_steps=6, eval_strategy="steps", eval_steps=3, report_to="none",
               disable_tqdm=True, per_device_train_batch_size=4, **kw)


def test_unknowable_metric_fails_before_training_F_EVAL_2(tmp_path):
    fit = _fit(tmp_path, metric_for_best_model="accuracy")
    with pytest.raises(ValueError, match=r"metric_for_best_model='accuracy' \('eval_accuracy'\) can never be "
                                         r"computed.*only 'eval_loss'.*compute_metrics"):
        fit.fit(HFClassifier(features=3, classes=2, seed=None), hf_rows(), hf_rows(8))
    assert fit.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))
    _fit(tmp_path, metric_for_best_model="loss").fit(HFClassifier(features=3, classes=2, seed=None), hf_rows(), hf_rows(8))  # the one it reports works


def test_missing_metric_fails_at_the_first_evaluation_naming_the_keys_F_EVAL_2(tmp_path):
    fit = _fit(tmp_path, metric_for_best_model="acc")
    with pytest.raises(KeyError) as err:
        fit.fit(Logged(), hf_rows(), hf_rows(8))
    msg = str(err.value)
    assert "metric_for_best_model='acc' ('eval_acc') is not among the evaluation metrics ['eval_loss', 'val_acc']" in msg
    assert "Did you mean 'val_acc'" in msg and "runtime" not in msg
    assert fit.state.global_step == 3  # the first evaluation, not the end of the run
