"""F-EVAL-1 (validate/evaluate/test/predict, prefixes, named eval sets) and F-EVAL-2 in one process
(compute_metrics, preprocess_logits_for_metrics, eval_accumulation_steps, include_inputs_for_metrics,
batch_eval_metrics, prediction_loss_only, eval_do_concat_batches, padding of variable-length outputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.models import Classifier, classification_data
from taskfit import EvalPrediction, Fit, PredictionOutput
from torch import nn
from torch.utils.data import TensorDataset

N_CLASSES = 3


def _fit(tmp_path, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k in ("compute_metrics", "preprocess_logits_for_metrics")}
    opts.update(kwargs)
    return Fit(**opts, **extra)


def _data(n: int, seed: int) -> TensorDataset:
    return classification_data(n, features=4, classes=N_CLASSES, seed=seed)


def _expected(module: Classifier, data: TensorDataset) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Logits, labels, loss and accuracy over the whole set (batch-size-weighted means = overall means)."""
    x, y = data.tensors
    with torch.no_grad():
        logits = module(x)
    return (logits.numpy(), y.numpy(), float(nn.functional.cross_entropy(logits, y)),
            float((logits.argmax(-1) == y).float().mean()))


def _drop_speed(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.endswith(("_runtime", "_per_second"))}


@pytest.fixture
def trained(tmp_path):
    """A classifier trained for 3 steps; evaluation data is 10 samples (batches 4, 4, 2)."""
    module = Classifier(features=4, classes=N_CLASSES)
    fit = _fit(tmp_path, max_steps=3, learning_rate=0.1)
    fit.fit(module, _data(12, 0))
    return fit, module, _data(10, 1)


# ------------------------------------------------------------------------------- validate / evaluate ---
def test_validate_and_evaluate_are_aliases_F_EVAL_1(tmp_path):
    """F-EVAL-1: ``validate(module, data)``, HF-style ``evaluate(eval_dataset)`` and ``evaluate()`` on the eval
    data given to fit return the same metrics: ``eval_loss``, logged names, speed metrics."""
    module = Classifier(features=4, classes=N_CLASSES)
    ev = _data(10, 1)
    fit = _fit(tmp_path, max_steps=3, eval_strategy="steps", eval_steps=3)
    fit.fit(module, _data(12, 0), ev)
    _, _, loss, acc = _expected(module, ev)
    a = fit.validate(module, ev)
    b = fit.evaluate(ev)
    c = fit.evaluate()
    for m in (a, b, c):
        assert m["eval_loss"] == pytest.approx(loss, rel=1e-6)
        assert m["eval_acc"] == pytest.approx(acc)
        assert {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch"} <= set(m)
        assert m["epoch"] == fit.state.epoch
    assert _drop_speed(a) == _drop_speed(b) == _drop_speed(c)
    assert fit.evaluate(ev, metric_key_prefix="dev")["dev_loss"] == pytest.approx(loss, rel=1e-6)


def test_validate_before_fit_F_EVAL_1(tmp_path):
    """F-EVAL-1: a module can be evaluated without training first; ``epoch`` is 0 then (as HF 5 reports it)."""
    module = Classifier(features=4, classes=N_CLASSES)
    ev = _data(10, 1)
    m = _fit(tmp_path).validate(module, ev)
    assert m["eval_loss"] == pytest.approx(_expected(module, ev)[2], rel=1e-6) and m["epoch"] == 0
    assert module.training  # the module's mode is restored


def test_named_eval_datasets_F_EVAL_1(tmp_path):
    """F-EVAL-1: a dict of named eval sets gives ``eval_<name>_<metric>`` keys, in fit and in validate; each
    equals the metric of that set on its own."""
    module = Classifier(features=4, classes=N_CLASSES)
    sets = {"small": _data(6, 2), "large": _data(10, 3)}
    fit = _fit(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2)
    fit.fit(module, _data(16, 0), sets)
    during = [h for h in fit.state.log_history if "eval_small_loss" in h]
    assert [h["step"] for h in during] == [2, 4]
    assert all("eval_large_loss" in h and "eval_large_acc" in h and "eval_loss" not in h for h in during)
    m = fit.validate(data=sets)
    for name, data in sets.items():
        _, _, loss, acc = _expected(module, data)
        assert m[f"eval_{name}_loss"] == pytest.approx(loss, rel=1e-6)
        assert m[f"eval_{name}_acc"] == pytest.approx(acc)
        assert f"eval_{name}_runtime" in m
    assert during[-1]["eval_small_loss"] == pytest.approx(m["eval_small_loss"], rel=1e-6)


def test_test_prefixes_test_F_EVAL_1(trained):
    """F-EVAL-1: ``test()`` runs test_step (default: validation_step) with ``test_`` keys; dicts of sets too."""
    fit, module, ev = trained
    _, _, loss, acc = _expected(module, ev)
    m = fit.test(module, ev)
    assert m["test_loss"] == pytest.approx(loss, rel=1e-6) and m["test_acc"] == pytest.approx(acc)
    assert "test_runtime" in m and not any(k.startswith("eval_") for k in m)
    m = fit.test(data={"a": ev})
    assert m["test_a_loss"] == pytest.approx(loss, rel=1e-6)


# -------------------------------------------------------------------------------------------- predict ---
def test_predict_concatenates_predictions_and_labels_F_EVAL_1(trained):
    """F-EVAL-1: ``predict`` returns PredictionOutput: predict_step outputs concatenated over batches in dataset
    order (numpy, (N, C)), the labels (N,), and ``test_`` speed metrics."""
    fit, module, ev = trained
    out = fit.predict(module, ev)
    logits, labels, _, _ = _expected(module, ev)
    assert isinstance(out, PredictionOutput)
    assert isinstance(out.predictions, np.ndarray) and out.predictions.shape == (10, N_CLASSES)
    np.testing.assert_allclose(out.predictions, logits, rtol=1e-6)
    np.testing.assert_array_equal(out.label_ids, labels)
    assert {"test_runtime", "test_samples_per_second"} <= set(out.metrics)


def test_predict_with_compute_metrics_F_EVAL_1(trained):
    """F-EVAL-1: with labels and compute_metrics, predict's metrics include the computed ones (HF behaviour)."""
    fit, module, ev = trained
    fit.compute_metrics = lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}
    out = fit.predict(module, ev)
    assert out.metrics["test_accuracy"] == pytest.approx(_expected(module, ev)[3])


def test_predict_dict_outputs_F_EVAL_1(trained):
    """F-EVAL-1: a predict_step returning a dict gives a dict of concatenated arrays."""
    fit, module, ev = trained

    class DictPredict(Classifier):
        def predict_step(self, batch, batch_idx):
            logits = self(batch[0])
            return {"probs": logits.softmax(-1), "top": logits.argmax(-1)}

    other = DictPredict()
    other.load_state_dict(module.state_dict())
    out = fit.predict(other, ev)
    logits = _expected(module, ev)[0]
    assert set(out.predictions) == {"probs", "top"}
    assert out.predictions["probs"].shape == (10, N_CLASSES)
    np.testing.assert_array_equal(out.predictions["top"], logits.argmax(-1))


# ------------------------------------------------------------------------------------ compute_metrics ---
def test_compute_metrics_gets_all_predictions_F_EVAL_2(trained):
    """F-EVAL-2: ``compute_metrics(EvalPrediction)`` is called once per evaluation with every prediction and
    label in dataset order; its keys get the ``eval_`` prefix unless they already have one."""
    fit, module, ev = trained
    seen = []

    def compute_metrics(p):
        seen.append(p)
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean()), "eval_custom": 7}

    fit.compute_metrics = compute_metrics
    m = fit.evaluate(ev)
    logits, labels, _, acc = _expected(module, ev)
    assert len(seen) == 1 and isinstance(seen[0], EvalPrediction) and seen[0].inputs is None
    np.testing.assert_allclose(seen[0].predictions, logits, rtol=1e-6)
    np.testing.assert_array_equal(seen[0].label_ids, labels)
    assert m["eval_accuracy"] == pytest.approx(acc) and m["eval_custom"] == 7


def test_preprocess_logits_for_metrics_F_EVAL_2(trained):
    """F-EVAL-2: ``preprocess_logits_for_metrics(logits, labels)`` runs per batch before collection, so
    compute_metrics receives its output (here argmax ids, shape (N,))."""
    fit, module, ev = trained
    calls, seen = [], []

    def preprocess(logits, labels):
        calls.append((tuple(logits.shape), tuple(labels.shape)))
        return logits.argmax(-1)

    fit.preprocess_logits_for_metrics = preprocess
    fit.compute_metrics = lambda p: seen.append(p) or {"accuracy": float((p.predictions == p.label_ids).mean())}
    m = fit.evaluate(ev)
    assert calls == [((4, 3), (4,)), ((4, 3), (4,)), ((2, 3), (2,))]
    assert seen[0].predictions.shape == (10,)
    np.testing.assert_array_equal(seen[0].predictions, _expected(module, ev)[0].argmax(-1))
    assert m["eval_accuracy"] == pytest.approx(_expected(module, ev)[3])


def test_eval_accumulation_steps_gives_identical_results_F_EVAL_2(trained):
    """F-EVAL-2: moving outputs to the host every batch (``eval_accumulation_steps=1``) or every 2 batches gives
    exactly the same predictions and metrics as once at the end."""
    fit, _module, ev = trained
    seen = []
    fit.compute_metrics = lambda p: seen.append(p) or {"s": float(p.predictions.sum())}
    results = []
    for steps in (None, 1, 2):
        fit.args.eval_accumulation_steps = steps
        results.append((_drop_speed(fit.evaluate(ev)), fit.predict(ev)))
    for metrics, pred in results[1:]:
        assert metrics == results[0][0]
        np.testing.assert_array_equal(pred.predictions, results[0][1].predictions)
        np.testing.assert_array_equal(pred.label_ids, results[0][1].label_ids)
    for p in seen[1:]:
        np.testing.assert_array_equal(p.predictions, seen[0].predictions)


def test_include_inputs_for_metrics_F_EVAL_2(trained):
    """F-EVAL-2: ``include_inputs_for_metrics`` passes the inputs (first tuple element) as ``inputs``."""
    fit, _module, ev = trained
    seen = []
    fit.compute_metrics = lambda p: seen.append(p) or {}
    fit.args.include_inputs_for_metrics = True
    fit.evaluate(ev)
    assert seen[0].inputs.shape == (10, 4)
    np.testing.assert_array_equal(seen[0].inputs, ev.tensors[0].numpy())


def test_batch_eval_metrics_F_EVAL_2(trained):
    """F-EVAL-2: with ``batch_eval_metrics`` compute_metrics is called per batch with that batch only and
    ``compute_result=False``, then ``True`` on the last batch, whose returned dict is the result (HF)."""
    fit, module, ev = trained
    calls = []
    state = {"correct": 0, "total": 0}

    def compute_metrics(p, compute_result):
        calls.append((p.predictions.shape, p.label_ids.shape, compute_result))
        state["correct"] += int((p.predictions.argmax(-1) == p.label_ids).sum())
        state["total"] += len(p.label_ids)
        if compute_result:
            out = {"accuracy": state["correct"] / state["total"]}
            state.update(correct=0, total=0)
            return out
        return {}

    fit.compute_metrics = compute_metrics
    fit.args.batch_eval_metrics = True
    m = fit.evaluate(ev)
    assert calls == [((4, 3), (4,), False), ((4, 3), (4,), False), ((2, 3), (2,), True)]
    assert m["eval_accuracy"] == pytest.approx(_expected(module, ev)[3])


def test_prediction_loss_only_F_EVAL_2(trained):
    """F-EVAL-2: ``prediction_loss_only`` skips collecting predictions and compute_metrics; the loss stays."""
    fit, module, ev = trained
    calls = []
    fit.compute_metrics = lambda p: calls.append(p) or {"accuracy": 1.0}
    fit.args.prediction_loss_only = True
    m = fit.evaluate(ev)
    assert calls == [] and "eval_accuracy" not in m
    assert m["eval_loss"] == pytest.approx(_expected(module, ev)[2], rel=1e-6)


def test_prediction_loss_only_in_predict_F_EVAL_2(trained):
    """F-EVAL-2: as its help says ("In evaluation and prediction, return only the loss") and as HF does,
    ``prediction_loss_only`` makes predict return no predictions."""
    fit, _module, ev = trained
    fit.args.prediction_loss_only = True
    assert fit.predict(ev).predictions is None


def test_eval_do_concat_batches_false_returns_lists_F_EVAL_2(trained):
    """F-EVAL-2: ``eval_do_concat_batches=False`` keeps one array per batch (predict and compute_metrics)."""
    fit, module, ev = trained
    seen = []
    fit.compute_metrics = lambda p: seen.append(p) or {}
    fit.args.eval_do_concat_batches = False
    out = fit.predict(ev)
    assert isinstance(out.predictions, list) and [a.shape for a in out.predictions] == [(4, 3), (4, 3), (2, 3)]
    assert [a.shape for a in out.label_ids] == [(4,), (4,), (2,)]
    np.testing.assert_allclose(np.concatenate(out.predictions), _expected(module, ev)[0], rtol=1e-6)
    fit.evaluate(ev)
    assert isinstance(seen[-1].predictions, list) and len(seen[-1].predictions) == 3


def test_variable_length_predictions_are_padded_F_EVAL_2(tmp_path):
    """F-EVAL-2: per-batch outputs of different sequence lengths are concatenated with -100 padding (HF
    ``nested_concat``), for predictions and token labels alike."""

    class Tokens(Classifier):
        def predict_step(self, batch, batch_idx):
            x, _y = batch
            width = 2 + batch_idx  # batch k has sequence length 2 + k
            return x[:, :1].repeat(1, width)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            width = 2 + batch_idx
            return {"logits": x[:, :1].repeat(1, width), "labels": y[:, None].repeat(1, width)}

    ev = _data(10, 1)
    fit = _fit(tmp_path)
    out = fit.predict(Tokens(), ev)
    assert out.predictions.shape == (10, 4)
    x = ev.tensors[0][:, 0].numpy()
    for row, (start, width) in enumerate([(0, 2)] * 4 + [(4, 3)] * 4 + [(8, 4)] * 2):
        np.testing.assert_array_equal(out.predictions[row, :width], np.full(width, x[row], dtype=np.float32))
        assert (out.predictions[row, width:] == -100).all()
    seen = []
    fit.compute_metrics = lambda p: seen.append(p) or {}
    fit.validate(Tokens(), ev)
    labels = seen[0].label_ids
    assert labels.shape == (10, 4)
    assert (labels[:4, 2:] == -100).all() and (labels[4:8, 3:] == -100).all() and (labels[8:] != -100).all()
    np.testing.assert_array_equal(labels[:, 0], ev.tensors[1].numpy())


def test_eval_metrics_are_callback_metrics_F_EVAL_1(trained):
    """F-EVAL-1: evaluation metrics are available in ``fit.callback_metrics`` and logged to log_history."""
    fit, _module, ev = trained
    m = fit.evaluate(ev)
    assert fit.callback_metrics["eval_loss"] == m["eval_loss"]
    assert fit.state.log_history[-1]["eval_loss"] == m["eval_loss"]
