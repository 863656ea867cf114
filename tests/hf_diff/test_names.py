"""``taskfit.hf`` names and the HF constructor shape of ``Fit`` (F-HF-1)."""

from __future__ import annotations

import numpy as np
import torch

import taskfit.hf as hf
from taskfit import Fit, FitArguments
from common import RegressionDataset, RegressionModel, args_for, assert_same, summary


def test_hf_names_are_taskfit_classes_F_HF_1():
    """F-HF-1: the HF names exist; Trainer is Fit (one implementation), the arguments are FitArguments."""
    assert issubclass(hf.Trainer, Fit) and hf.Seq2SeqTrainer is hf.Trainer
    assert hf.TrainingArguments is FitArguments and hf.Seq2SeqTrainingArguments is FitArguments
    for name in ("TrainerCallback", "EarlyStoppingCallback", "TrainerState", "TrainerControl", "EvalPrediction",
                 "set_seed", "TrainOutput", "PredictionOutput"):
        assert getattr(hf, name) is not None
    preds, labels = hf.EvalPrediction(np.zeros(2), np.ones(2))
    assert preds.tolist() == [0.0, 0.0] and labels.tolist() == [1.0, 1.0]


def test_fit_takes_hf_constructor_shape_F_HF_1(tmp_path):
    """F-HF-1: ``Fit(model=, args=, train_dataset=, eval_dataset=).train()`` equals ``taskfit.hf.Trainer`` with
    HF's positional order, and evaluate() before training uses the constructor's eval_dataset."""
    data, ev = RegressionDataset(length=32), RegressionDataset(length=8, seed=1)
    runs = []
    for make in (lambda a, m: Fit(model=m, args=a, train_dataset=data, eval_dataset=ev),
                 lambda a, m: hf.Trainer(m, a, None, data, ev)):
        hf.set_seed(42)
        t = make(args_for(hf, str(tmp_path / str(len(runs))), max_steps=4), RegressionModel())
        before = t.evaluate()["eval_loss"]
        runs.append((before, summary(t, t.train())))
    assert_same(runs[0], runs[1])
    assert runs[0][0] > 0 and runs[0][1]["global_step"] == 4


def test_train_trial_dict_sets_args_F_HF_1(tmp_path):
    """F-HF-1: ``train(trial={...})`` sets those arguments for the training; an unknown keyword is a TypeError."""
    t = hf.Trainer(RegressionModel(), args_for(hf, str(tmp_path)), train_dataset=RegressionDataset(length=16))
    out = t.train(trial={"max_steps": 3})
    assert out.global_step == 3 and t.args.max_steps == 3
    try:
        t.train(bogus=1)
    except TypeError as exc:
        assert "bogus" in str(exc)
    else:
        raise AssertionError("train(bogus=1) must raise")


def test_optimizer_cls_and_kwargs_on_fit_F_HF_1(tmp_path):
    """F-HF-1: ``optimizer_cls_and_kwargs`` builds that optimizer with the given keywords."""
    t = Fit(model=RegressionModel(), args=args_for(hf, str(tmp_path), max_steps=2),
            train_dataset=RegressionDataset(length=16),
            optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.01, "momentum": 0.5}))
    t.train()
    assert isinstance(t.optimizer, torch.optim.SGD) and t.optimizer.defaults["momentum"] == 0.5
