"""More of HF's own Trainer scenarios (``tests/trainer/test_trainer.py``: ``test_eval_on_start``,
``test_save_only_model``, ``test_load_best_model_at_end`` with ``save_total_limit``, ``test_label_smoothing``,
``test_neftune``), each run under ``transformers.Trainer`` and ``taskfit.hf.Trainer`` with the same user code
(F-HF-1): weights (exact, fp32 CPU), log history, TrainOutput, checkpoint folders and the files in them."""

from __future__ import annotations

import os
import types

import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

import torch  # noqa: E402
from common import RegressionDataset, RegressionModel, args_for, assert_same, both, summary  # noqa: E402
from torch import nn  # noqa: E402

TRAIN = RegressionDataset(length=32)
EVAL = RegressionDataset(length=16, seed=1)
#: files taskfit adds to a checkpoint folder (docs/hf.md "Intended differences"), and the one HF writes alone
TASKFIT_ONLY = {"manifest.json", "fit_args.json", "training_state.pt", "rng_state_0.pt", "config.json"}
HF_ONLY = {"training_args.bin"}


def _folders(out: str) -> dict[str, list[str]]:
    """``checkpoint-N`` folder -> its files, HF's names only (what both write)."""
    return {d: sorted(set(os.listdir(os.path.join(out, d))) - TASKFIT_ONLY - HF_ONLY)
            for d in sorted(os.listdir(out)) if d.startswith("checkpoint-")}


def _regression(m, out, **kw):
    m.set_seed(42)
    t = m.Trainer(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=TRAIN, eval_dataset=EVAL)
    r = t.train()
    return t, r


def test_eval_on_start_and_empty_cache_steps_F_HF_1(tmp_path):
    """F-HF-1: ``eval_on_start=True`` evaluates once before the first step (a step-0 row with the initial
    model's ``eval_loss``), then as usual; ``torch_empty_cache_steps`` (nothing to empty on the CPU) changes
    nothing: the same log history and weights."""
    def run(m, out):
        t, r = _regression(m, out, eval_strategy="steps", eval_steps=3, max_steps=6, logging_steps=3,
                           eval_on_start=True, torch_empty_cache_steps=2)
        return summary(t, r)
    hf, tf = both(run, tmp_path)
    assert_same(hf, tf)
    evals = [r["step"] for r in hf["log_history"] if "eval_loss" in r]
    assert evals == [0, 3, 6]


def test_save_only_model_F_HF_1(tmp_path):
    """F-HF-1: ``save_only_model=True`` writes checkpoints with the model and ``trainer_state.json`` but no optimizer,
    scheduler or RNG state, in the same folders; training is unchanged."""
    def run(m, out):
        t, r = _regression(m, out, save_strategy="steps", save_steps=4, max_steps=8, save_only_model=True)
        return summary(t, r), _folders(out)
    hf, tf = both(run, tmp_path)
    assert_same(hf, tf)
    assert hf[1] == {"checkpoint-4": ["model.safetensors", "trainer_state.json"],
                     "checkpoint-8": ["model.safetensors", "trainer_state.json"]}


def test_load_best_model_at_end_with_save_total_limit_F_HF_1(tmp_path):
    """F-HF-1: ``load_best_model_at_end`` with ``save_total_limit=1`` keeps the best checkpoint and the newest
    one while training (the best is never deleted, the newest survives for resuming) and the best alone at the end
    (HF deletes the others after training), records the same ``best_model_checkpoint`` / ``best_metric`` and ends
    with the best checkpoint's weights. Documented difference: taskfit's final train row and ``TrainOutput.metrics``
    also carry ``best_global_step``, ``best_metric`` and ``best_model_checkpoint``."""
    def run(m, out):
        # a high learning rate: eval_loss rises after the first steps, so the best is not the last
        t, r = _regression(m, out, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                           max_steps=8, learning_rate=1.5, save_total_limit=1, load_best_model_at_end=True)
        best = os.path.basename(t.state.best_model_checkpoint)
        return summary(t, r), sorted(_folders(out)), best, t.state.best_metric
    hf, tf = both(run, tmp_path)
    # documented difference: taskfit's final train row and TrainOutput.metrics also carry the best checkpoint
    best = {"best_global_step": int(tf[2].split("-")[1]), "best_metric": tf[3],
            "best_model_checkpoint": os.path.join(str(tmp_path), "tf", tf[2])}
    final_row, train_metrics = tf[0]["log_history"][-1], tf[0]["train_output"][2]
    assert {k: final_row.pop(k) for k in best} == best == {k: train_metrics.pop(k) for k in best}
    tf[0]["train_metric_keys"] = [k for k in tf[0]["train_metric_keys"] if k not in best]
    assert_same(hf, tf)
    assert hf[2] != "checkpoint-8" and hf[1] == [hf[2]]  # the newest was kept while training, deleted at the end


class Classifier(nn.Module):
    """3 classes from 4 features, returning ``{"loss", "logits"}`` (the loss only given labels); a ``config``, as
    HF's label smoothing reads ``model.config.problem_type``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.config = types.SimpleNamespace(problem_type="single_label_classification")

    def forward(self, x, labels=None):
        logits = self.lin(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def _classes(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return [{"x": x[i], "label": int(x[i, 0] > 0) + int(x[i, 1] > 0)} for i in range(n)]


def test_label_smoothing_factor_F_HF_1(tmp_path):
    """F-HF-1: ``label_smoothing_factor=0.1`` trains on HF's smoothed loss (``LabelSmoother``) and evaluates with
    it: the same weights, training losses and ``eval_loss``."""
    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=Classifier(), args=args_for(m, out, label_smoothing_factor=0.1, max_steps=6,
                                                        logging_steps=2, eval_strategy="steps", eval_steps=3),
                      train_dataset=_classes(48, 0), eval_dataset=_classes(16, 1))
        return summary(t, t.train())
    hf, tf = both(run, tmp_path)
    assert_same(hf, tf)


class TokenRegressor(nn.Module):
    """Mean of token embeddings -> a number: ``get_input_embeddings`` names the layer NEFTune adds noise to."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 6)
        self.head = nn.Linear(6, 1)

    def get_input_embeddings(self) -> nn.Module:
        return self.emb

    def forward(self, input_ids, labels=None):
        y = self.head(self.emb(input_ids).mean(1)).squeeze(-1)
        return (y,) if labels is None else (nn.functional.mse_loss(y, labels), y)


def _tokens(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 12, (n, 5), generator=g)
    return [{"input_ids": ids[i], "labels": ids[i].float().mean() / 6} for i in range(n)]


def test_neftune_noise_alpha_F_HF_1(tmp_path):
    """F-HF-1: ``neftune_noise_alpha=5`` adds HF's uniform noise to the input embeddings while training (not in the
    evaluations): the same noise draws, so the same weights and log history; the hook is gone afterwards."""
    def run(m, out):
        m.set_seed(42)
        model = TokenRegressor()
        t = m.Trainer(model=model, args=args_for(m, out, neftune_noise_alpha=5.0, max_steps=4, logging_steps=2,
                                                 eval_strategy="steps", eval_steps=2),
                      train_dataset=_tokens(32, 0), eval_dataset=_tokens(8, 1))
        s = summary(t, t.train())
        model.train()
        ids = torch.arange(5)[None]
        return s, torch.equal(model.emb(ids), nn.functional.embedding(ids, model.emb.weight))
    hf, tf = both(run, tmp_path)
    assert_same(hf, tf)
    assert hf[1] is True
