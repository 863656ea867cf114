"""Packed and pre-tokenised batches of a causal LM under ``taskfit.hf.Trainer`` equal ``transformers.Trainer``'s
(the peer as oracle, the same user code, fp32 CPU).

- HF's ``DataCollatorWithFlattening`` packs rows into one row with ``position_ids``; HF 5 turns the model's cache off
  while training (``TrainingArguments.use_cache``, default False), else the model ignores the sequence boundaries.
- Rows whose fields are Python lists (a tokenised ``datasets.Dataset``, no tokenizer) are tensorised by the
  default collator as ``transformers.default_data_collator`` does.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from finetune_common import both, equal_rows, stable, tiny_llama, token_rows, weights  # noqa: E402


def _train(m: Any, out: str, rows: Any, collator: Any = None, **kw: Any) -> tuple[list, dict, Any]:
    model = tiny_llama()
    options = dict(per_device_train_batch_size=4, max_steps=3, logging_steps=1, learning_rate=1e-2,
                   report_to="none", save_strategy="no", use_cpu=True)
    args = m.TrainingArguments(output_dir=out, **{**options, **kw})
    trainer = m.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    return stable(trainer.state.log_history), weights(model), model


def test_flattening_collator_same_as_transformers_F_FT_1(tmp_path):
    """Packed rows (``DataCollatorWithFlattening``): every logged loss (the first step's included) and the weights
    after 3 steps are bitwise those of transformers; the cache is off while training, as HF sets it."""
    from transformers import DataCollatorWithFlattening

    (hf_log, hf_w, _), (tf_log, tf_w, model) = both(
        lambda m, out: _train(m, out, token_rows(), DataCollatorWithFlattening()), tmp_path)
    assert [r["loss"] for r in tf_log if "loss" in r] == [r["loss"] for r in hf_log if "loss" in r]
    assert tf_log == hf_log
    for k in hf_w:
        assert torch.equal(tf_w[k], hf_w[k]), k
    assert model.config.use_cache is False


def test_use_cache_true_is_applied_F_FT_1(tmp_path):
    """``use_cache=True`` leaves the cache on, as under transformers (the same losses, which then differ from the
    run with the cache off: the packed rows' boundaries are ignored)."""
    from transformers import DataCollatorWithFlattening

    (hf_log, _, _), (tf_log, _, model) = both(
        lambda m, out: _train(m, out, token_rows(), DataCollatorWithFlattening(), use_cache=True, max_steps=1),
        tmp_path)
    assert tf_log == hf_log and model.config.use_cache is True


def test_pretokenised_list_rows_same_as_transformers_F_FT_2(tmp_path):
    """A tokenised ``datasets.Dataset`` (fields are Python lists) without a collator or tokenizer trains as under
    transformers: bitwise the same log history and weights."""
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_list(equal_rows())
    (hf_log, hf_w, _), (tf_log, tf_w, _) = both(lambda m, out: _train(m, out, rows), tmp_path)
    assert tf_log == hf_log
    for k in hf_w:
        assert torch.equal(tf_w[k], hf_w[k]), k


def test_list_rows_collate_as_transformers_default_data_collator_F_FT_2():
    """The default collator gives what ``transformers.default_data_collator`` gives for list rows (``label``
    renamed, strings left out), and the same batch without transformers' help; ragged rows raise a ValueError
    that names the padding and flattening collators."""
    from transformers import default_data_collator

    from taskfit.data.loaders import _tensorise, default_collate_with_labels

    rows = [{"input_ids": [3, 4, 5], "attention_mask": [1, 1, 1], "label": 1, "text": "a"},
            {"input_ids": [6, 7, 8], "attention_mask": [1, 1, 0], "label": 0, "text": "b"}]
    ours, hf, plain = default_collate_with_labels(rows), default_data_collator(rows), _tensorise(rows)
    assert set(ours) == set(hf) == set(plain) == {"input_ids", "attention_mask", "labels"}
    for k in hf:
        assert torch.equal(ours[k], hf[k]) and ours[k].dtype == hf[k].dtype, k
        assert torch.equal(plain[k], hf[k]) and plain[k].dtype == hf[k].dtype, k
    assert ours["input_ids"].shape == (2, 3)
    with pytest.raises(ValueError, match="DataCollatorWithPadding.*DataCollatorWithFlattening"):
        default_collate_with_labels([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 2]}])
