"""What evaluation and prediction hand to ``compute_metrics`` and return, and the collator a script sees, each under
``transformers.Trainer`` and ``taskfit.hf.Trainer`` with the same user code (F-HF-1): a model returning a dict or a
``ModelOutput`` with outputs besides the logits gives the predictions as HF's tuple, ``ignore_keys`` (of
``evaluate``, ``predict`` and ``train(ignore_keys_for_eval=...)``) and ``config.keys_to_ignore_at_inference``
leave outputs out as in HF, on the default evaluation path (no ``prediction_step`` override); and
``trainer.data_collator`` is HF's default (``DataCollatorWithPadding`` for a tokenizer)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

import torch  # noqa: E402
from common import RegressionDataset, args_for, assert_same, both, stable, summary  # noqa: E402
from torch import nn  # noqa: E402
from transformers.modeling_outputs import ModelOutput  # noqa: E402

TRAIN = RegressionDataset(length=16)
EVAL = RegressionDataset(length=16, seed=1)  # whole eval batches: eval_loss exact


@dataclasses.dataclass
class ExtraOutput(ModelOutput):
    """An HF model output with extra tensors (None fields are left out, as in every ``ModelOutput``)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    scores: torch.Tensor | None = None


class ExtraOutputsModel(nn.Module):
    """``y = a x + b`` returning ``{"loss", "logits", "hidden", "scores"}`` (the loss only given labels; an
    :class:`ExtraOutput` with ``model_output``): outputs besides the logits, as a model asked for its hidden
    states returns them; ``ignore`` sets ``config.keys_to_ignore_at_inference``."""

    def __init__(self, model_output: bool = False, ignore: list[str] | None = None) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.5))
        self.b = nn.Parameter(torch.tensor(0.0))
        self.model_output = model_output
        if ignore is not None:
            self.config = types.SimpleNamespace(keys_to_ignore_at_inference=ignore)

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        out = {"loss": nn.functional.mse_loss(y, labels)} if labels is not None else {}
        out.update(logits=y, hidden=torch.stack([y, 2 * y], dim=-1), scores=y + 1)
        return ExtraOutput(**out) if self.model_output else out


def _shape(p):
    """The structure of predictions: a tuple of shapes, or one shape."""
    return tuple(_shape(x) for x in p) if isinstance(p, tuple) else tuple(np.asarray(p).shape)


def _metrics(p):
    preds = p.predictions
    flat = preds if isinstance(preds, tuple) else (preds,)
    return {"n_outputs": len(flat), "total": float(sum(np.asarray(x, dtype=np.float64).sum() for x in flat))}


def _ignore_run(m, out, model_output, ignore, eval_keys, train_keys):
    m.set_seed(42)
    t = m.Trainer(model=ExtraOutputsModel(model_output, ignore),
                  args=args_for(m, out, eval_strategy="steps", eval_steps=2, max_steps=4, logging_steps=2),
                  train_dataset=TRAIN, eval_dataset=EVAL, compute_metrics=_metrics)
    r = t.train(ignore_keys_for_eval=train_keys)
    after = stable(t.evaluate(ignore_keys=eval_keys))
    pred = t.predict(EVAL, ignore_keys=eval_keys)
    unlabeled = t.predict([{"input_x": x} for x in EVAL.x[:4]], ignore_keys=eval_keys)
    return (summary(t, r), after, _shape(pred.predictions), pred.predictions, stable(pred.metrics),
            _shape(unlabeled.predictions), unlabeled.predictions)


@pytest.mark.parametrize("model_output,ignore,eval_keys,train_keys,n_outputs", [
    (False, None, None, None, 3),                     # every output but the loss: (logits, hidden, scores)
    (True, None, ["hidden"], ["scores", "hidden"], 2),  # ignore_keys of evaluate/predict (training: 1 output)
    (True, ["hidden", "scores"], None, None, 1),      # config.keys_to_ignore_at_inference: the logits alone
], ids=["dict-all-outputs", "model-output-ignore-keys", "config-keys-to-ignore"])
def test_ignore_keys_on_the_default_evaluation_path_F_HF_1(tmp_path, model_output, ignore, eval_keys, train_keys,
                                                          n_outputs):
    """F-HF-1: a model returning ``{"loss", "logits", "hidden", "scores"}``: evaluation during training, evaluate()
    and predict() (labeled and unlabeled data) give compute_metrics and PredictionOutput HF's predictions: a tuple
    of every output but the loss and the ignored keys (``ignore_keys`` given, else the config's
    ``keys_to_ignore_at_inference``), one output unwrapped; the same log history, metrics and arrays."""
    hf, tf = both(lambda m, out: _ignore_run(m, out, model_output, ignore, eval_keys, train_keys), tmp_path)
    assert_same(hf, tf)
    assert hf[1]["eval_n_outputs"] == n_outputs
    during = [r["eval_n_outputs"] for r in hf[0]["log_history"] if "eval_n_outputs" in r]
    assert during == [1 if train_keys else n_outputs] * 2 + [n_outputs]  # steps 2, 4, then evaluate()
    expected = ((16,), (16, 2), (16,))[:n_outputs] if ignore is None and eval_keys is None else None
    if expected is not None:
        assert hf[2] == expected


# ------------------------------------------------------------------------------------------ data_collator ---
def _tokenizer():
    """A small word-level tokenizer built in memory (no download): a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "good": 2, "bad": 3, "movie": 4, "very": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class BagModel(nn.Module):
    """Mean of token embeddings -> 2 classes (``input_ids``, ``attention_mask``, ``labels``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, input_ids, attention_mask=None, labels=None):
        mask = attention_mask.unsqueeze(-1).float()
        logits = self.head((self.emb(input_ids) * mask).sum(1) / mask.sum(1))
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def _collator_run(m, out, with_tokenizer):
    m.set_seed(42)
    tok = _tokenizer() if with_tokenizer else None
    if with_tokenizer:
        texts = ["good movie", "very bad movie", "bad", "very very good movie", "good", "bad movie"] * 2
        data = [{**tok(t), "label": int("good" in t)} for t in texts]
        model = BagModel()
    else:
        data, model = TRAIN, ExtraOutputsModel()
    t = m.Trainer(model=model, args=args_for(m, out, max_steps=3, per_device_train_batch_size=4, logging_steps=1),
                  train_dataset=data, processing_class=tok)
    collator = t.data_collator
    batch = collator([data[i] for i in range(4)])
    r = t.train()
    kind = type(collator).__name__ if not isinstance(collator, types.FunctionType) else "function"
    return (kind, getattr(collator, "tokenizer", None) is tok, {k: v for k, v in batch.items()},
            summary(t, r))


@pytest.mark.parametrize("with_tokenizer", [False, True], ids=["default", "tokenizer"])
def test_data_collator_attribute_is_hfs_default_F_HF_1(tmp_path, with_tokenizer):
    """F-HF-1: ``trainer.data_collator`` is never None: HF's ``DataCollatorWithPadding(processing_class)`` with a
    tokenizer, else a function collating like ``default_data_collator`` (``label`` -> ``labels``); a script
    calling it gets the same batch, and training pads and trains as HF."""
    hf, tf = both(lambda m, out: _collator_run(m, out, with_tokenizer), tmp_path)
    assert hf[0] == tf[0] == ("DataCollatorWithPadding" if with_tokenizer else "function")
    assert hf[1] and tf[1]
    assert_same(hf[2], tf[2])
    assert_same(hf[3], tf[3])
    if with_tokenizer:
        assert hf[2]["input_ids"].shape == (4, 4)  # padded to the longest of the 4 samples
