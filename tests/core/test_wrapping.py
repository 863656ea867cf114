"""F-CORE-2: training a plain model (a Hugging Face model or any nn.Module that returns its loss) without
writing a TaskModule, with the HF Trainer's override points (``compute_loss``, ``compute_loss_func``,
``label_names``, ``remove_unused_columns``) and outputs (``evaluate``, ``predict``, ``save_model``, F-CORE-7).

The HF model is a tiny ``BertForSequenceClassification`` built from a ``BertConfig`` with random weights (no
download). The task is learnable: the label is the first token id modulo 3.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from taskfit import EvalPrediction, Fit, PredictionOutput
from torch import nn
from torch.utils.data import TensorDataset

transformers = pytest.importorskip("transformers")

NUM_LABELS = 3
CLASS_WEIGHTS = [1.0, 2.0, 3.0]


def _bert(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=NUM_LABELS,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(cfg)


def _samples(n: int, seed: int, extra: bool = False) -> list[dict]:
    """Dict samples of variable length (4..8 tokens) with an int label; ``extra`` adds unused columns."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 9, (1,), generator=g))
        ids = torch.randint(1, 30, (length,), generator=g).tolist()
        sample = {"input_ids": ids, "labels": ids[0] % NUM_LABELS}
        if extra:
            sample.update(idx=len(out), text="unused")
        out.append(sample)
    return out


class PadCollator:
    """Pads ``input_ids`` with 0 and builds ``attention_mask``; other keys are stacked or kept as lists."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, samples: list[dict]) -> dict:
        self.calls += 1
        width = max(len(s["input_ids"]) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        mask = torch.zeros(len(samples), width, dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
            mask[i, : len(s["input_ids"])] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        for k in samples[0]:
            if k in ("input_ids",):
                continue
            vals = [s[k] for s in samples]
            batch[k] = torch.tensor(vals) if isinstance(vals[0], (int, float)) else vals
        return batch


@pytest.fixture(scope="module")
def train_set():
    return _samples(32, seed=0)


@pytest.fixture(scope="module")
def eval_set():
    return _samples(12, seed=1)


def _fit(tmp_path, cls=Fit, **kwargs):
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8, "learning_rate": 1e-2,
            "lr_scheduler_type": "constant", "logging_steps": 1}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k in ("compute_metrics", "compute_loss_func",
                                                             "data_collator", "callbacks")}
    opts.update(kwargs)
    return cls(**opts, **extra)


def _losses(fit: Fit) -> list[float]:
    return [h["loss"] for h in fit.state.log_history if "loss" in h]


def _weighted_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    loss_fct = nn.CrossEntropyLoss(weight=torch.tensor(CLASS_WEIGHTS, device=logits.device))
    return loss_fct(logits.view(-1, NUM_LABELS), labels.view(-1))


# ---------------------------------------------------------------------------------------- HF models ---
def test_hf_model_trains_without_taskmodule_F_CORE_2(tmp_path, train_set, eval_set):
    """F-CORE-2: ``fit.fit(model, train_dataset, eval_dataset, data_collator=...)`` trains a plain HF model:
    the collator builds the batches, the loss falls, ``fit.validate()`` returns ``eval_loss`` which improved."""
    model = _bert()
    collator = PadCollator()
    fit = _fit(tmp_path, num_train_epochs=4, eval_strategy="epoch")
    before = fit.validate(model, eval_set, data_collator=collator)["eval_loss"]
    out = fit.fit(model, train_set, eval_set, data_collator=collator)
    assert out.global_step == 16 and collator.calls >= 16
    losses = _losses(fit)
    assert len(losses) == 16
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])
    metrics = fit.validate()
    assert set(metrics) >= {"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}
    assert math.isfinite(metrics["eval_loss"]) and metrics["eval_loss"] < before
    # the evaluations during fit (one per epoch) logged eval_loss too
    assert len([h for h in fit.state.log_history if "eval_loss" in h]) == 5
    assert fit.model is model and fit.module.model is model


def test_compute_metrics_gets_eval_prediction_F_CORE_2(tmp_path, train_set, eval_set):
    """F-CORE-2 / F-EVAL-2: compute_metrics receives an EvalPrediction with predictions (N, num_labels) and
    label_ids (N,) over all 12 eval samples (batches of 8 and 4), in dataset order; its results are prefixed."""
    seen = []

    def compute_metrics(p):
        seen.append(p)
        return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    model = _bert()
    fit = _fit(tmp_path, max_steps=2, compute_metrics=compute_metrics, data_collator=PadCollator())
    fit.fit(model, train_set)
    metrics = fit.evaluate(eval_set)
    p = seen[-1]
    assert isinstance(p, EvalPrediction)
    assert isinstance(p.predictions, np.ndarray) and p.predictions.shape == (12, NUM_LABELS)
    assert isinstance(p.label_ids, np.ndarray) and p.label_ids.shape == (12,)
    assert p.label_ids.tolist() == [s["labels"] for s in eval_set]
    with torch.no_grad():
        batch = PadCollator()(eval_set)
        model.eval()
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    np.testing.assert_allclose(p.predictions, expected.numpy(), rtol=1e-4, atol=1e-5)
    assert metrics["eval_accuracy"] == float((expected.argmax(-1).numpy() == p.label_ids).mean())


class WeightedLossFit(Fit):
    """The weighted-loss example of the HF docs (``Trainer.compute_loss`` override)."""

    calls: list[tuple[bool, float]]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor(CLASS_WEIGHTS, device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        self.calls.append((return_outputs, float(loss.detach())))
        return (loss, outputs) if return_outputs else loss


def test_compute_loss_override_is_used_for_training_F_CORE_2(tmp_path, train_set):
    """F-CORE-2: a ``Fit`` subclass overriding ``compute_loss(model, inputs, return_outputs=False)`` trains
    with that loss: it is called once per micro-batch and the logged losses are its values."""
    fit = _fit(tmp_path, cls=WeightedLossFit, max_steps=4, data_collator=PadCollator())
    fit.calls = []
    fit.fit(_bert(), train_set)
    assert len(fit.calls) == 4 and not any(r for r, _ in fit.calls)
    np.testing.assert_allclose(_losses(fit), [v for _, v in fit.calls], rtol=1e-5)


def test_eval_loss_uses_compute_loss_override_F_CORE_2(tmp_path, train_set, eval_set):
    """F-CORE-2 / F-EVAL-1: as in HF (``prediction_step`` calls ``compute_loss(model, inputs,
    return_outputs=True)``), ``eval_loss`` is the overridden loss, here the class-weighted cross entropy."""
    model = _bert()
    fit = _fit(tmp_path, cls=WeightedLossFit, max_steps=1, per_device_eval_batch_size=12,
               data_collator=PadCollator())
    fit.calls = []
    fit.fit(model, train_set)
    assert fit.evaluate(eval_set)["eval_loss"] == pytest.approx(_weighted_eval_loss(model, eval_set), rel=1e-5)


def _weighted_eval_loss(model, eval_set) -> float:
    """The class-weighted loss of ``model`` on the whole eval set, computed by hand."""
    with torch.no_grad():
        batch = PadCollator()(eval_set)
        model.eval()
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return float(_weighted_ce(logits, batch["labels"]))


def _recording_loss_func(calls: list):
    def loss_func(outputs, labels, num_items_in_batch=None):
        assert outputs.loss is None  # labels were taken out of the inputs
        loss = _weighted_ce(outputs.logits, labels)
        calls.append((tuple(labels.shape), float(loss.detach())))
        return loss

    return loss_func


def test_compute_loss_func_F_CORE_2(tmp_path, train_set):
    """F-CORE-2: ``compute_loss_func(outputs, labels, num_items_in_batch)`` gets the model outputs (computed
    without labels) and the labels; its value is the training loss."""
    calls: list = []
    fit = _fit(tmp_path, max_steps=3, compute_loss_func=_recording_loss_func(calls), data_collator=PadCollator())
    fit.fit(_bert(), train_set)
    assert [c[0] for c in calls] == [(8,)] * 3
    np.testing.assert_allclose(_losses(fit), [c[1] for c in calls], rtol=1e-5)


def test_eval_loss_uses_compute_loss_func_F_CORE_2(tmp_path, train_set, eval_set):
    """F-CORE-2 / F-EVAL-1: as in HF (evaluation goes through ``compute_loss``), ``eval_loss`` is the value of
    ``compute_loss_func``."""
    calls: list = []
    model = _bert()
    fit = _fit(tmp_path, max_steps=1, compute_loss_func=_recording_loss_func(calls), data_collator=PadCollator(),
               per_device_eval_batch_size=12)
    fit.fit(model, train_set)
    assert fit.evaluate(eval_set)["eval_loss"] == pytest.approx(_weighted_eval_loss(model, eval_set), rel=1e-5)


def test_predict_returns_numpy_prediction_output_F_CORE_2(tmp_path, train_set, eval_set):
    """F-CORE-2 / F-EVAL-1: ``fit.predict`` returns ``PredictionOutput`` with numpy predictions (N, num_labels),
    label_ids (N,) and ``test_``-prefixed metrics including the loss."""
    fit = _fit(tmp_path, max_steps=2, data_collator=PadCollator())
    fit.fit(_bert(), train_set)
    out = fit.predict(eval_set)
    assert isinstance(out, PredictionOutput)
    assert isinstance(out.predictions, np.ndarray) and out.predictions.shape == (12, NUM_LABELS)
    assert out.predictions.dtype == np.float32
    assert out.label_ids.tolist() == [s["labels"] for s in eval_set]
    assert "test_loss" in out.metrics and "test_runtime" in out.metrics


def test_save_model_round_trips_through_from_pretrained_F_CORE_7(tmp_path, train_set):
    """F-CORE-7 / F-CORE-2: ``save_model`` writes ``config.json`` + ``model.safetensors`` that
    ``from_pretrained`` loads back to identical weights."""
    model = _bert()
    fit = _fit(tmp_path, max_steps=2, data_collator=PadCollator())
    fit.fit(model, train_set)
    folder = tmp_path / "final"
    assert fit.save_model(str(folder)) == str(folder)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == NUM_LABELS
    loaded = transformers.BertForSequenceClassification.from_pretrained(str(folder))
    trained = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert not torch.equal(_bert().classifier.weight, model.classifier.weight)  # it did train


def test_remove_unused_columns_for_hf_model_F_CORE_5(tmp_path):
    """F-CORE-5 / F-CORE-2: ``remove_unused_columns=True`` (default) drops dataset keys that are not forward
    parameters before they reach the model, also for HF models whose forward ends in ``**kwargs`` (every model
    in transformers >= 5); HF's Trainer builds the kept set from the signature's named parameters."""
    model = _bert()
    seen: list[set] = []
    model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(set(kwargs)), with_kwargs=True)
    fit = _fit(tmp_path, max_steps=2, data_collator=PadCollator())
    fit.fit(model, _samples(16, seed=0, extra=True))
    assert seen and all(keys == {"input_ids", "attention_mask", "labels"} for keys in seen), seen


# ------------------------------------------------------------------------------------- plain modules ---
class TupleModel(nn.Module):
    """``forward(x, labels)`` returns ``(loss, logits)``, like HF models with ``return_dict=False``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

    def forward(self, x, labels=None):
        logits = self.net(x)
        if labels is None:
            return (logits,)
        return nn.functional.cross_entropy(logits, labels), logits


def _tuple_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def test_plain_module_with_tuple_batches_trains_F_CORE_2(tmp_path):
    """F-CORE-2: a plain nn.Module whose ``forward(x, labels)`` returns ``(loss, logits)`` trains on ``(x, y)``
    tuple batches; evaluation returns eval_loss; predict returns the logits and labels."""
    model = TupleModel()
    fit = _fit(tmp_path, num_train_epochs=6, learning_rate=0.05)
    train, ev = _tuple_data(64, 0), _tuple_data(20, 1)
    before = fit.validate(model, ev)["eval_loss"]
    fit.fit(model, train)
    losses = _losses(fit)
    assert len(losses) == 48 and np.mean(losses[-8:]) < 0.6 * np.mean(losses[:8])
    after = fit.validate(model, ev)["eval_loss"]
    assert after < 0.6 * before
    out = fit.predict(ev)
    assert out.predictions.shape == (20, 2) and out.label_ids.tolist() == ev.tensors[1].tolist()
    with torch.no_grad():
        np.testing.assert_allclose(out.predictions, model.net(ev.tensors[0]).numpy(), rtol=1e-5, atol=1e-6)
    assert out.metrics["test_loss"] == pytest.approx(after, rel=1e-5)


class DictModel(nn.Module):
    """``forward(x, target=None)`` returns ``{"loss", "logits"}``: labels live under a custom key."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 2)

    def forward(self, x, target=None):
        logits = self.layer(x)
        out = {"logits": logits}
        if target is not None:
            out["loss"] = nn.functional.cross_entropy(logits, target)
        return out


def _dict_data(n: int, seed: int, label_key: str = "target") -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return [{"x": x[i], label_key: int(x[i, 0] > 0), "idx": i, "note": "unused"} for i in range(n)]


def test_label_names_custom_key_F_CORE_2(tmp_path):
    """F-CORE-2: ``label_names=["target"]``: the labels for compute_metrics / predict come from ``target``."""
    seen = []

    def compute_metrics(p):
        seen.append(p.label_ids)
        return {"acc": float((p.predictions.argmax(-1) == p.label_ids).mean())}

    data = _dict_data(10, 3)
    fit = _fit(tmp_path, max_steps=2, label_names=["target"], compute_metrics=compute_metrics)
    fit.fit(DictModel(), _dict_data(16, 0))
    metrics = fit.evaluate(data)
    assert seen[-1].tolist() == [d["target"] for d in data]
    assert "eval_acc" in metrics and "eval_loss" in metrics
    out = fit.predict(data)
    assert out.label_ids.tolist() == [d["target"] for d in data]
    assert out.predictions.shape == (10, 2)


def test_remove_unused_columns_plain_module_F_CORE_5(tmp_path):
    """F-CORE-5: the extra keys ``idx`` and ``note`` (not forward parameters) are dropped by default; with
    ``remove_unused_columns=False`` they reach forward, which then refuses them."""
    fit = _fit(tmp_path, max_steps=2, label_names=["target"])
    assert fit.fit(DictModel(), _dict_data(16, 0)).global_step == 2
    fit = _fit(tmp_path, max_steps=2, label_names=["target"], remove_unused_columns=False)
    with pytest.raises(TypeError, match="idx|note"):
        fit.fit(DictModel(), _dict_data(16, 0))
