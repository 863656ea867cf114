"""F-EVAL-2 on real data (sklearn digits): compute_metrics, logged and returned torchmetrics objects and a hand
computation agree; label_names; eval_accumulation_steps keeps device memory bounded; eval memory metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchmetrics
from taskfit import Fit
from taskfit.loops.evaluation_loop import EvaluationLoop
from torch.utils.data import DataLoader

from eval_digits_data import DigitClassifier, digits


def _accuracy(p) -> dict:
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    train, ev = digits()
    module = DigitClassifier(lambda: torchmetrics.classification.MulticlassAccuracy(num_classes=10, average="micro"))
    fit = Fit(output_dir=str(tmp_path_factory.mktemp("digits")), disable_tqdm=True, report_to="none",
              save_strategy="no", max_steps=60, learning_rate=0.5, optim="sgd", per_device_train_batch_size=32,
              per_device_eval_batch_size=64, label_names=["digit"], compute_metrics=_accuracy)
    fit.fit(module, train)
    with torch.no_grad():
        x = torch.stack([s["pixels"] for s in ev])
        y = torch.stack([s["digit"] for s in ev])
        hand = int((module(x).argmax(-1) == y).sum()) / len(y)  # correct / total, exact
    return fit, module, ev, hand


def test_compute_metrics_and_torchmetrics_match_a_hand_computation_F_EVAL_2(trained):
    """F-EVAL-2: on 397 real digits, HF-style compute_metrics, a returned torchmetrics object and the hand
    computation (argmax of the module's logits over the whole set) give the same accuracy; the trained model
    is far above chance; ``label_names=["digit"]`` tells where the labels are."""
    fit, _module, ev, hand = trained
    assert hand > 0.85
    m = fit.evaluate(ev)
    assert m["eval_accuracy"] == pytest.approx(hand, abs=1e-9)
    assert m["eval_tm_accuracy"] == pytest.approx(hand, abs=1e-6)
    again = fit.evaluate(ev)  # the returned metric was reset after the first evaluation, not accumulated
    assert again["eval_tm_accuracy"] == pytest.approx(hand, abs=1e-6)


def test_logged_torchmetrics_object_matches_too_F_EVAL_2(trained):
    """F-EVAL-2: a torchmetrics object passed to ``self.log`` in validation_step is computed over the whole
    evaluation and reset for the next one: same accuracy as the hand computation, twice."""
    fit, module, ev, hand = trained

    class Logged(DigitClassifier):
        def __init__(self) -> None:
            super().__init__()
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10, average="micro")

        def validation_step(self, batch, batch_idx):
            logits = self(batch["pixels"])
            self.acc(logits, batch["digit"])
            self.log("acc", self.acc)
            return nn_loss(logits, batch["digit"])

    other = Logged()
    other.load_state_dict(module.state_dict(), strict=False)
    assert fit.validate(other, ev)["eval_acc"] == pytest.approx(hand, abs=1e-6)
    assert fit.validate(other, ev)["eval_acc"] == pytest.approx(hand, abs=1e-6)


def nn_loss(logits, y):
    return torch.nn.functional.cross_entropy(logits, y)


def test_eval_accumulation_steps_bounds_device_memory_F_EVAL_2(trained):
    """F-EVAL-2: collected logits stay on the device only until ``eval_accumulation_steps`` batches are
    held: the collector's peak is 2 batches' logits (2 x 64 x 10 float32 = 5,120 bytes) with steps=2 and all
    7 batches (397 x 10 x 4 = 15,880 bytes) without; predictions are identical either way."""
    fit, module, ev, _ = trained
    fit.compute_metrics = _accuracy
    loader = DataLoader(ev, batch_size=64)
    peaks, preds = {}, {}
    for steps in (None, 2, 1):
        fit.args.eval_accumulation_steps = steps
        fit._eval_entry(module, None, "validate")
        loop = EvaluationLoop(fit, "validate", fit._hooks)
        _metrics, preds[steps], _labels = loop.run(loader, "eval")
        peaks[steps] = loop.peak_device_bytes
    fit.args.eval_accumulation_steps = None
    assert peaks == {None: 397 * 10 * 4, 2: 2 * 64 * 10 * 4, 1: 64 * 10 * 4}
    np.testing.assert_array_equal(preds[2], preds[None])
    np.testing.assert_array_equal(preds[1], preds[None])


def test_eval_memory_metrics_F_EVAL_4(trained):
    """F-EVAL-4: ``skip_memory_metrics=False`` adds the evaluation stage's memory deltas (bytes) with the
    stage prefix; off by default."""
    fit, _module, ev, _ = trained
    assert not any("_mem_" in k for k in fit.evaluate(ev))
    fit.args.skip_memory_metrics = False
    try:
        m = fit.evaluate(ev)
    finally:
        fit.args.skip_memory_metrics = True
    assert isinstance(m["eval_mem_cpu_alloc_delta"], int) and m["eval_mem_cpu_peaked_delta"] >= 0
