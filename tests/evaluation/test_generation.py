"""F-EVAL-3: sequence-to-sequence evaluation and prediction with ``generate`` (``predict_with_generate``,
``generation_max_length``, ``generation_num_beams``, ``generation_config``) on a tiny random T5 built from a
``transformers`` config (no download)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from taskfit import Fit

transformers = pytest.importorskip("transformers")

PAD, EOS = 0, 1


def _model():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=24, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                                   num_heads=2, decoder_start_token_id=PAD, pad_token_id=PAD, eos_token_id=EOS,
                                   dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).eval()


def _samples(n: int = 6) -> list[dict]:
    """Sources of lengths 3..8 and targets of lengths 2..4; padded per batch by the collator."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        src = torch.randint(2, 24, (3 + i,), generator=g)
        tgt = torch.randint(2, 24, (2 + i // 2,), generator=g)
        out.append({"input_ids": src, "labels": tgt})
    return out


def collate(samples: list[dict]) -> dict:
    width = max(len(s["input_ids"]) for s in samples)
    lwidth = max(len(s["labels"]) for s in samples)
    ids = torch.full((len(samples), width), PAD)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    labels = torch.full((len(samples), lwidth), -100)
    for i, s in enumerate(samples):
        ids[i, :len(s["input_ids"])] = s["input_ids"]
        mask[i, :len(s["input_ids"])] = 1
        labels[i, :len(s["labels"])] = s["labels"]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _fit(tmp_path, **kw) -> Fit:
    extra = {k: kw.pop(k) for k in list(kw) if k in ("compute_metrics",)}
    return Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
               per_device_eval_batch_size=3, predict_with_generate=True, data_collator=collate, **kw, **extra)


def _direct(model, data, **gen) -> list[np.ndarray]:
    """model.generate on each batch of 3, by hand."""
    out = []
    with torch.no_grad():
        for i in range(0, len(data), 3):
            b = collate(data[i:i + 3])
            out.append(model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **gen).numpy())
    return out


def test_evaluate_passes_generated_ids_to_compute_metrics_F_EVAL_3(tmp_path):
    """F-EVAL-3: with ``predict_with_generate`` and ``generation_max_length=6``, compute_metrics receives the
    ids ``generate`` returns (shape (6, 6): each batch padded to max_length with the pad id), the labels padded
    across batches with -100 (batch widths 3 and 4), and eval_loss is the model's own loss."""
    model, data = _model(), _samples()
    seen = []
    fit = _fit(tmp_path, generation_max_length=6,
               compute_metrics=lambda p: seen.append(p) or {"exact": float((p.predictions[:, 1:3] == 5).mean())})
    metrics = fit.evaluate(model, data)
    (p,) = seen
    assert p.predictions.shape == (6, 6) and p.label_ids.shape == (6, 4)
    expected = _direct(model, data, max_length=6)
    for k, batch in enumerate(expected):
        rows = p.predictions[3 * k:3 * k + 3]
        np.testing.assert_array_equal(rows[:, :batch.shape[1]], batch)
        assert (rows[:, batch.shape[1]:] == PAD).all()
    assert (p.label_ids[:3, 3:] == -100).all() and (p.label_ids[3:, :2] != -100).all()
    with torch.no_grad():
        losses = [float(model(**collate(data[i:i + 3])).loss) for i in (0, 3)]
    assert metrics["eval_loss"] == pytest.approx(np.mean(losses), rel=1e-5)
    assert "eval_exact" in metrics


def test_predict_returns_generated_ids_with_beams_and_config_F_EVAL_3(tmp_path):
    """F-EVAL-3: ``predict`` returns generated ids; ``generation_num_beams=2`` gives what
    ``generate(num_beams=2)`` gives; a ``generation_config`` dict (``max_new_tokens=3``) bounds the length to
    1 + 3 and pads to it."""
    model, data = _model(), _samples()
    out = _fit(tmp_path, generation_max_length=5, generation_num_beams=2).predict(model, data)
    expected = _direct(model, data, max_length=5, num_beams=2)
    assert out.predictions.shape == (6, 5)
    for k, batch in enumerate(expected):
        np.testing.assert_array_equal(out.predictions[3 * k:3 * k + 3, :batch.shape[1]], batch)
    out = _fit(tmp_path, generation_config={"max_new_tokens": 3, "do_sample": False}).predict(model, data)
    assert out.predictions.shape == (6, 4)
    expected = _direct(model, data, max_new_tokens=3)
    for k, batch in enumerate(expected):
        np.testing.assert_array_equal(out.predictions[3 * k:3 * k + 3, :batch.shape[1]], batch)
    assert out.label_ids.shape == (6, 4)


def test_generate_needed_and_loss_only_skips_generation_F_EVAL_3(tmp_path):
    """F-EVAL-3: a model without ``generate`` fails before any batch with a clear message; with
    ``prediction_loss_only`` nothing is generated (HF)."""
    calls = []
    model = _model()
    original = model.generate
    model.generate = lambda *a, **k: calls.append(1) or original(*a, **k)
    _fit(tmp_path, prediction_loss_only=True, compute_metrics=lambda p: {}).evaluate(model, _samples())
    assert calls == []
    with pytest.raises(ValueError, match="predict_with_generate=True needs a model with a generate"):
        _fit(tmp_path).predict(torch.nn.Linear(2, 2), [{"input_ids": torch.ones(2)}])
