"""F-HPO-1: hyperparameter search with Optuna on a real small task (sklearn digits)."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from taskfit import Fit
from taskfit.fit.hpo import BestRun, default_compute_objective

from eval_digits_data import DigitClassifier, digits

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _accuracy(p) -> dict:
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}


def _fit(tmp_path, **kw) -> Fit:
    return Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to="csv", save_strategy="no", max_steps=20,
               optim="sgd", per_device_train_batch_size=32, per_device_eval_batch_size=128, label_names=["digit"],
               eval_strategy="steps", eval_steps=10, compute_metrics=_accuracy, **kw)


def _space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1.0, log=True)}


def test_three_trial_search_returns_the_best_trial_F_HPO_1(tmp_path):
    """F-HPO-1: 3 trials, each from a fresh ``model_init()`` model, logged under ``output_dir/run-{n}``; the
    returned BestRun is the trial with the highest eval accuracy, with its learning rate; the trained weights
    differ between trials; the Fit is restored afterwards."""
    train, ev = digits()
    models = []

    def model_init():
        models.append(DigitClassifier())
        return models[-1]

    fit = _fit(tmp_path)
    best = fit.hyperparameter_search(_space, compute_objective=lambda m: m["eval_accuracy"], n_trials=3,
                                     direction="maximize", train_data=train, eval_data=ev, model_init=model_init,
                                     sampler=optuna.samplers.RandomSampler(seed=0))
    assert isinstance(best, BestRun) and len(models) == 3
    trials = best.run_summary
    assert trials.number == int(best.run_id)
    scores = []
    for n, model in enumerate(models):
        with open(tmp_path / f"run-{n}" / "logs" / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("eval_accuracy")]
        assert [int(r["step"]) for r in rows] == [10, 20]
        scores.append(float(rows[-1]["eval_accuracy"]))
    assert best.objective == max(scores) and scores.index(max(scores)) == int(best.run_id)
    assert set(best.hyperparameters) == {"learning_rate"}
    w = [m.layer.weight.detach() for m in models]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2]) and not torch.equal(w[0], w[2])
    assert fit.args.output_dir == str(tmp_path) and fit.model_init is None and fit.module is None


def test_multi_objective_returns_the_pareto_front_F_HPO_1(tmp_path):
    """F-HPO-1: two directions give a list of BestRun whose objectives are [accuracy, loss] pairs; a
    model_init taking the trial gets it (a model option drawn by the trial)."""
    train, ev = digits()
    seen = []

    def model_init(trial):
        seen.append(trial.suggest_int("bias_off", 0, 1))
        return DigitClassifier()

    fit = _fit(tmp_path)
    front = fit.hyperparameter_search(_space, lambda m: [m["eval_accuracy"], m["eval_loss"]], n_trials=2,
                                      direction=["maximize", "minimize"], train_data=train, eval_data=ev,
                                      model_init=model_init, sampler=optuna.samplers.RandomSampler(seed=1))
    assert isinstance(front, list) and 1 <= len(front) <= 2 and len(seen) == 2
    for run in front:
        assert len(run.objective) == 2 and 0 <= run.objective[0] <= 1 and run.objective[1] > 0
        assert set(run.hyperparameters) == {"learning_rate", "bias_off"}


def test_pruning_stops_a_trial_on_its_intermediate_metric_F_HPO_1(tmp_path):
    """F-HPO-1: each evaluation's objective is reported to the trial; when the study's pruner says so,
    training stops at that step and the trial ends PRUNED (trial 1 is pruned at its first evaluation)."""
    train, ev = digits()

    class PruneSecond(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.number == 1 and trial.last_step is not None

    fit = _fit(tmp_path)
    fit.hyperparameter_search(_space, lambda m: m["eval_accuracy"], n_trials=2, direction="maximize",
                              train_data=train, eval_data=ev, model_init=DigitClassifier, pruner=PruneSecond(),
                              study_name="prune", storage=None)
    with open(tmp_path / "run-1" / "logs" / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert max(steps) == 10  # stopped at the first evaluation of 20 steps
    with open(tmp_path / "run-0" / "logs" / "metrics.csv") as f:
        assert max(int(r["step"]) for r in csv.DictReader(f)) == 20


def test_bad_search_input_fails_before_training_F_HPO_1(tmp_path, monkeypatch):
    """F-HPO-1: unknown backend or direction, no model_init, no data, a trial setting a component option, and
    a missing optuna all fail with a clear message."""
    train, ev = digits()
    fit = _fit(tmp_path)
    with pytest.raises(ValueError, match="backend='ray' is not supported; choose one of \\('optuna',\\)"):
        fit.hyperparameter_search(backend="ray", train_data=train, model_init=DigitClassifier)
    with pytest.raises(ValueError, match="direction 'up' is not valid"):
        fit.hyperparameter_search(direction="up", train_data=train, model_init=DigitClassifier)
    with pytest.raises(ValueError, match="needs model_init"):
        fit.hyperparameter_search(train_data=train)
    with pytest.raises(ValueError, match="needs train_data"):
        fit.hyperparameter_search(model_init=DigitClassifier)
    with pytest.raises(ValueError, match=r"hp_space returned \['strategy'\]"):
        fit.hyperparameter_search(lambda t: {"strategy": "ddp"}, n_trials=1, train_data=train,
                                  model_init=DigitClassifier)
    assert not os.path.exists(tmp_path / "run-0" / "logs")
    import taskfit.loggers.logger as base

    monkeypatch.setattr(base, "RequirementCache", lambda module: False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'taskfit\[optuna\]'"):
        fit.hyperparameter_search(train_data=train, model_init=DigitClassifier)
    assert default_compute_objective({"eval_loss": 0.5, "eval_runtime": 3.0, "epoch": 1}) == 0.5
    assert default_compute_objective({"eval_loss": 0.5, "eval_accuracy": 0.9, "eval_f1": 0.8}) == pytest.approx(1.7)
    assert default_compute_objective({"train_loss": 0.25}) == 0.25
