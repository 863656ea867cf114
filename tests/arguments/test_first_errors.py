"""F-CORE-4 / F-EVAL-2: the errors a new user meets first. ``metric_for_best_model`` that no evaluation can
produce fails before training when that is knowable, else at the first evaluation naming the metrics that exist."""

from __future__ import annotations

import pytest
from helpers.models import Classifier, HFClassifier, classification_data, hf_rows
from taskfit import Fit


def _fit(tmp_path, **kw):
    return Fit(output_dir=str(tmp_path), max_steps=6, eval_strategy="steps", eval_steps=3, report_to="none",
               disable_tqdm=True, per_device_train_batch_size=4, **kw)


def test_unknowable_metric_fails_before_training_F_EVAL_2(tmp_path):
    fit = _fit(tmp_path, metric_for_best_model="accuracy")
    with pytest.raises(ValueError, match=r"metric_for_best_model='accuracy' \('eval_accuracy'\) can never be "
                                         r"computed.*only 'eval_loss'.*compute_metrics"):
        fit.fit(HFClassifier(features=3, classes=2, seed=None), hf_rows(), hf_rows(8))
    assert fit.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))
    model = HFClassifier(features=3, classes=2, seed=None)
    _fit(tmp_path, metric_for_best_model="loss").fit(model, hf_rows(), hf_rows(8))  # the one it reports works


def test_missing_metric_fails_at_the_first_evaluation_naming_the_keys_F_EVAL_2(tmp_path):
    fit = _fit(tmp_path, metric_for_best_model="accuracy")
    with pytest.raises(KeyError) as err:
        fit.fit(Classifier(features=3, classes=2, seed=None), classification_data(32, features=3, classes=2),
                classification_data(8, features=3, classes=2, seed=1))
    msg = str(err.value)
    assert ("metric_for_best_model='accuracy' ('eval_accuracy') is not among the evaluation metrics "
            "['eval_acc', 'eval_loss']") in msg
    assert "Did you mean 'eval_acc'" in msg and "runtime" not in msg
    assert fit.state.global_step == 3  # the first evaluation, not the end of the run
