"""F-LOOP-7: NEFTune (training-time embedding noise) and label_smoothing_factor."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _tasks import SEQ, VOCAB, WIDTH, TokenModel, args, tiny_gpt2, token_data
from helpers.models import HFClassifier
from taskfit import Fit
from taskfit.efficiency import activate_neftune, deactivate_neftune
from torch import nn


class RecordEmbeddings:
    """Records the clean lookup (a hook on the embedding) and what the first block receives (its pre-hook), which
    is the embedding output after NEFTune's hook."""

    def __init__(self, emb, consumer):
        self.outputs, self.inputs = [], []
        emb.register_forward_hook(self)
        consumer.register_forward_pre_hook(lambda m, inputs: self.outputs.append((inputs[0].detach().clone(),
                                                                                   m.training)))

    def __call__(self, module, inputs, output):
        self.inputs.append(F.embedding(inputs[0], module.weight.detach()))  # the clean lookup at this time


def test_f_loop_7_neftune_noise_in_training_only_and_removed(tmp_path):
    """F-LOOP-7: with neftune_noise_alpha=5 the training-time embedding output differs from the clean lookup by
    uniform noise bounded by alpha/sqrt(seq_len*hidden); evaluation outputs equal the clean ones; after training
    the hook and attribute are gone and the layer gives clean outputs in train mode too."""
    module = TokenModel()
    fit = Fit(args(tmp_path, max_steps=3, neftune_noise_alpha=5.0, eval_strategy="steps", eval_steps=3))
    data = token_data()
    rec = RecordEmbeddings(module.emb, module.blocks[0])
    fit.fit(module, data, data[:4])
    bound = 5.0 / math.sqrt(SEQ * WIDTH)
    train = [(o, ids) for (o, training), ids in zip(rec.outputs, rec.inputs) if training]
    evals = [(o, ids) for (o, training), ids in zip(rec.outputs, rec.inputs) if not training]
    assert len(train) == 3 and len(evals) == 1
    for out, clean in train:
        noise = out - clean
        assert 0.5 * bound < noise.abs().max() <= bound and abs(float(noise.mean())) < 0.1 * bound
    for out, clean in evals:
        torch.testing.assert_close(out, clean, rtol=0, atol=0)
    assert list(module.emb._forward_hooks.values()) == [rec]
    assert not hasattr(module.emb, "neftune_noise_alpha") and not hasattr(module.emb, "_taskfit_neftune_handle")
    module.train()
    ids = data[0]["input_ids"][None]
    torch.testing.assert_close(module.emb(ids), F.embedding(ids, module.emb.weight))


def test_f_loop_7_neftune_hf_model_and_errors():
    """F-LOOP-7: an HF model's get_input_embeddings() layer gets the hook; a module with several embeddings and
    no get_input_embeddings is refused with a clear message."""
    model = tiny_gpt2()
    emb = activate_neftune(nn.ModuleDict({"model": model}), 10.0)
    assert emb is model.get_input_embeddings() and emb.neftune_noise_alpha == 10.0
    model.train()
    ids = torch.arange(SEQ)[None] % VOCAB
    assert not torch.equal(emb(ids), F.embedding(ids, emb.weight))
    deactivate_neftune(emb)
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    two = nn.ModuleDict({"a": nn.Embedding(3, 2), "b": nn.Embedding(3, 2)})
    with pytest.raises(ValueError, match="2 nn.Embedding layers.*define get_input_embeddings"):
        activate_neftune(two, 5.0)


class TinyForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, labels=None):
        return {"logits": self.head(self.emb(input_ids))}


def _hf_label_smoother(logits, labels, eps, shift=False):
    """HF's LabelSmoother formula, written out."""
    if shift:
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    log_probs = -F.log_softmax(logits.float(), dim=-1)
    labels = labels.unsqueeze(-1)
    pad = labels.eq(-100)
    labels = labels.clamp(min=0)
    nll = log_probs.gather(-1, labels).masked_fill(pad, 0.0)
    smooth = log_probs.sum(-1, keepdim=True).masked_fill(pad, 0.0)
    active = pad.numel() - pad.long().sum()
    return ((1 - eps) * nll.sum() / active + eps * smooth.sum() / (active * log_probs.shape[-1])).detach()


def test_f_loop_7_label_smoothing_matches_hf_formula(tmp_path):
    """F-LOOP-7: label_smoothing_factor=0.1 trains a plain model on HF's smoothed loss (checked against the
    written-out LabelSmoother formula), eval_loss is smoothed too, and causal LMs are shifted; tuple batches and a
    compute_loss_func are refused."""
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(8, generator=g), "labels": torch.tensor(i % 5)} for i in range(16)]
    model = HFClassifier(features=8, classes=5)  # HF-style: logits, and the loss when labels are given
    fit = Fit(args(tmp_path, max_steps=1, label_smoothing_factor=0.1, per_device_train_batch_size=16,
                   learning_rate=0.0))
    batch = {"x": torch.stack([d["x"] for d in data]), "labels": torch.stack([d["labels"] for d in data])}
    expected = _hf_label_smoother(model(batch["x"])["logits"], batch["labels"], 0.1)
    assert abs(float(expected - model(**batch)["loss"].detach())) > 1e-3  # smoothing changes the loss
    out = fit.fit(model, data)
    assert out.training_loss == pytest.approx(float(expected), rel=1e-6)
    assert fit.evaluate(model, data)["eval_loss"] == pytest.approx(float(expected), rel=1e-6)

    lm = TinyForCausalLM()
    toks = token_data(8)
    ids = torch.stack([d["input_ids"] for d in toks])
    labels = ids.clone()
    labels[:, :3] = -100
    lm_data = [{"input_ids": ids[i], "labels": labels[i]} for i in range(8)]
    fit = Fit(args(tmp_path, max_steps=1, label_smoothing_factor=0.2, per_device_train_batch_size=8,
                   learning_rate=0.0))
    expected = _hf_label_smoother(lm(ids)["logits"], labels, 0.2, shift=True)
    assert fit.fit(lm, lm_data).training_loss == pytest.approx(float(expected), rel=1e-6)

    with pytest.raises(ValueError, match="label_smoothing_factor needs dict batches"):
        Fit(args(tmp_path, max_steps=1, label_smoothing_factor=0.1)).fit(
            HFClassifier(features=8, classes=5), [(d["x"], d["labels"]) for d in data])
    with pytest.raises(ValueError, match="label_smoothing_factor=0.1 and compute_loss_func are both set"):
        Fit(args(tmp_path, label_smoothing_factor=0.1), compute_loss_func=lambda o, y, num_items_in_batch: 0)
