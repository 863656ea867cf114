"""F-HF-1: the evaluation and metrics gaps (G9, G10 of tests/peers/hf_gaps.md) found by transformers' own Trainer
tests, each asserted against transformers itself as the oracle: the same scenario runs under ``transformers`` and
under ``taskfit.hf``."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, both  # noqa: E402

TRAIN, EVAL = RegressionDataset(length=16), RegressionDataset(length=12, seed=1)


def _trainer(m: Any, out: str, compute_metrics: Any = None, **kw: Any) -> Any:
    m.set_seed(42)
    model = RegressionModel(a=1.5, b=2.5)
    return m.Trainer(model=model, args=args_for(m, out, per_device_eval_batch_size=5, **kw), train_dataset=TRAIN,
                     eval_dataset=EVAL, compute_metrics=compute_metrics)


class _Batched:
    """A ``batch_eval_metrics`` function that records what it receives, per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, bool]] = []
        self.errors: list[float] = []

    def __call__(self, pred: Any, compute_result: bool) -> Any:
        preds, labels = pred.predictions, pred.label_ids
        self.calls.append((type(preds).__name__, len(preds), compute_result))
        self.errors.extend((preds - labels).abs().tolist())  # HF hands tensors: .abs() is a tensor method
        if compute_result:
            return {"mae": float(np.mean(self.errors))}


def test_batch_eval_metrics_get_tensors_in_evaluate_and_predict_G9_F_HF_1(tmp_path):
    """G9: with ``batch_eval_metrics=True``, ``compute_metrics`` gets each batch's tensors and
    ``compute_result`` (True on the last batch) in ``evaluate()`` and in ``predict()``, whose predictions are still
    returned; the metrics are those of the last call."""
    def run(m, out):
        fn = _Batched()
        t = _trainer(m, out, compute_metrics=fn, batch_eval_metrics=True)
        ev = t.evaluate()
        pred = t.predict(EVAL)
        return (fn.calls, round(ev["eval_mae"], 6), round(pred.metrics["test_mae"], 6),
                np.round(pred.predictions, 5).tolist())
    hf, tf = both(run, tmp_path)
    assert hf == tf
    assert hf[0][:3] == [("Tensor", 5, False), ("Tensor", 5, False), ("Tensor", 2, True)]


def test_eval_use_gather_object_is_accepted_G9_F_HF_1(tmp_path):
    """G9: ``eval_use_gather_object=True`` trains, evaluates and predicts as HF (one process: nothing to
    gather), instead of being refused."""
    def run(m, out):
        t = _trainer(m, out, eval_use_gather_object=True, max_steps=2)
        t.train()
        ev = t.evaluate()
        return round(ev["eval_loss"], 6), np.round(t.predict(EVAL).predictions, 5).tolist()
    hf, tf = both(run, tmp_path)
    assert hf == tf


@pytest.mark.slow  # HF's memory tracker polls RSS in a busy thread: ~15 s on two shared cores
def test_memory_metrics_keys_G10_F_HF_1(tmp_path):
    """G10: ``skip_memory_metrics=False`` reports the construction's ``init_mem_*`` deltas (and
    ``before_init_mem_cpu``) once, in the first stage's metrics, then each stage's own deltas; none with the
    default ``True``."""
    def mem(d: dict) -> list[str]:
        return sorted(k for k in d if "_mem_" in k)

    def run(m, out):
        t = _trainer(m, out, skip_memory_metrics=False, max_steps=2)
        got = [mem(t.train().metrics), mem(t.evaluate()), mem(t.predict(EVAL).metrics)]
        quiet = _trainer(m, out + "q", max_steps=2)
        return got, mem(quiet.train().metrics), mem(quiet.evaluate())
    hf, tf = both(run, tmp_path)
    assert hf == tf
    assert "init_mem_cpu_alloc_delta" in hf[0][0] and hf[1] == hf[2] == []


def test_log_level_controls_running_training_block_G10_F_HF_1(tmp_path):
    """G10: the "***** Running training *****" block is logged at INFO on the ``transformers`` logger, so
    ``log_level="debug"`` shows it, ``"error"`` hides it, and ``"passive"`` keeps the library's WARNING."""
    from transformers.testing_utils import CaptureLogger, LoggingLevel
    from transformers.utils import logging as hf_logging

    def run(m, out):
        seen = []
        for level in ("passive", "debug", "error"):
            with LoggingLevel(logging.INFO if level != "passive" else logging.WARNING):
                with CaptureLogger(hf_logging.get_logger()) as cl:
                    _trainer(m, f"{out}-{level}", log_level=level, max_steps=1).train()
            seen.append(("Running training" in cl.out, "Total optimization steps = 1" in cl.out))
        return seen
    hf, tf = both(run, tmp_path)
    assert hf == tf == [(False, False), (True, True), (False, False)]


def test_total_flos_counts_tokens_as_hf_F_HF_1(tmp_path):
    """``total_flos`` of a ``PreTrainedModel``: 6 x main-input elements x non-embedding parameters per
    micro-batch, summed (HF's ``floating_point_ops``), with gradient accumulation too."""
    from transformers import PretrainedConfig, PreTrainedModel

    class TinyLM(PreTrainedModel):
        config_class = PretrainedConfig

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.emb = torch.nn.Embedding(11, 4)
            self.head = torch.nn.Linear(4, 11)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
            logits = self.head(self.emb(input_ids))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return {"loss": loss, "logits": logits}

    data = [{"input_ids": torch.arange(7) % 11, "labels": torch.arange(7) % 11} for _ in range(12)]

    def run(m, out):
        m.set_seed(0)
        t = m.Trainer(model=TinyLM(PretrainedConfig()), args=args_for(m, out, per_device_train_batch_size=2,
                                                                      gradient_accumulation_steps=2, max_steps=2),
                      train_dataset=data)
        t.train()
        return t.state.total_flos
    hf, tf = both(run, tmp_path)
    assert hf == tf == 6 * (2 * 7) * (4 * 11 + 11) * 4  # 4 micro-batches of 2 x 7 tokens, 55 non-embedding params


def test_greedy_lr_schedule_steps_with_the_eval_metric_F_HF_1(tmp_path):
    """``lr_scheduler_type="greedy"`` builds transformers' ``GreedyLR`` and steps it with
    ``metric_for_best_model`` after each evaluation, as HF: the same learning rates, epoch by epoch."""
    def run(m, out):
        class Logged(m.Trainer):
            def log(self, logs, *args):
                logs["lr_now"] = self.optimizer.param_groups[0]["lr"]
                super().log(logs, *args)

        m.set_seed(42)
        t = Logged(model=RegressionModel(), args=args_for(
            m, out, lr_scheduler_type="greedy", lr_scheduler_kwargs={"patience": 1, "factor": 0.5},
            eval_strategy="epoch", metric_for_best_model="eval_loss", num_train_epochs=4, learning_rate=0.2,
            per_device_train_batch_size=4), train_dataset=TRAIN, eval_dataset=EVAL)
        t.train()
        return type(t.lr_scheduler).__name__, [round(r["lr_now"], 8) for r in t.state.log_history if "eval_loss" in r]
    hf, tf = both(run, tmp_path)
    assert hf == tf and hf[0] == "GreedyLR"
