"""Differential callback and checkpoint scenarios against ``transformers.Trainer`` (F-HF-1), after HF's
tests/trainer/test_trainer_callback.py: the event sequence with the keyword names each event gets, callback
classes instantiated, early stopping at HF's step, checkpoint folders and a ``trainer_state.json`` that
``transformers.TrainerState.load_from_json`` reads."""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, assert_same, both, summary  # noqa: E402

TRAIN = RegressionDataset(length=32)
EVAL = RegressionDataset(length=16, seed=1)
EVENTS = ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end",
          "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_epoch_end", "on_evaluate", "on_log",
          "on_save", "on_train_end", "on_prediction_step", "on_predict")


def recorder(base: type) -> type:
    """A callback class (of ``base``) recording every event with the sorted names of its keyword arguments."""
    def make(name: str) -> Any:
        def hook(self, args, state, control, **kwargs):
            self.events.append((name, state.global_step))
        return hook

    ns = {name: make(name) for name in EVENTS}
    ns["__init__"] = lambda self: setattr(self, "events", [])
    return type("Recorder", (base,), ns)


@pytest.mark.parametrize("kw", [dict(), dict(eval_strategy="steps", eval_steps=3, logging_steps=2),
                                dict(gradient_accumulation_steps=2, eval_strategy="epoch"),
                                dict(save_strategy="steps", save_steps=3, logging_strategy="epoch")],
                         ids=["plain", "eval_steps", "accumulation_eval_epoch", "save_steps"])
def test_event_sequence_F_HF_1(kw, tmp_path):
    """F-HF-1: the sequence of callback events (with the step at each) equals transformers'."""
    def run(m, out):
        m.set_seed(42)
        cb = recorder(m.TrainerCallback)()
        t = m.Trainer(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=TRAIN,
                      eval_dataset=EVAL, callbacks=[cb])
        t.train()
        return cb.events
    hf, tf = both(run, tmp_path)
    assert hf == tf


def test_callback_class_instantiated_F_HF_1(tmp_path):
    """F-HF-1: a callback given as a class is instantiated, as HF does (it records events)."""
    def run(m, out):
        m.set_seed(42)
        cls = recorder(m.TrainerCallback)
        t = m.Trainer(model=RegressionModel(), args=args_for(m, out, max_steps=3), train_dataset=TRAIN,
                      callbacks=[cls])
        t.train()
        found = [cb for cb in t.callback_handler.callbacks if isinstance(cb, cls)] if hasattr(
            t, "callback_handler") else [cb for cb in t.callbacks if isinstance(cb, cls)]
        return found[0].events
    hf, tf = both(run, tmp_path)
    assert hf == tf and tf


@pytest.mark.parametrize("patience,threshold", [(1, 0.0), (2, 0.0), (1, 0.5)])
def test_early_stopping_step_F_HF_1(patience, threshold, tmp_path):
    """F-HF-1: EarlyStoppingCallback stops at the same step and best metric as under transformers."""
    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(), args=args_for(
            m, out, num_train_epochs=20, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
            load_best_model_at_end=True, metric_for_best_model="eval_loss", learning_rate=0.5),
            train_dataset=TRAIN, eval_dataset=EVAL,
            callbacks=[m.EarlyStoppingCallback(early_stopping_patience=patience,
                                               early_stopping_threshold=threshold)])
        t.train()
        return t.state.global_step, t.state.best_metric, os.path.basename(t.state.best_model_checkpoint or "")
    hf, tf = both(run, tmp_path)
    assert hf == tf


def test_checkpoint_folders_and_state_json_F_HF_1(tmp_path):
    """F-HF-1: checkpoint-N folders as transformers writes them; each trainer_state.json loads with
    ``transformers.TrainerState.load_from_json`` and holds the same global step and log history."""
    import transformers

    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(), args=args_for(m, out, save_strategy="steps", save_steps=3,
                                                               logging_steps=2),
                      train_dataset=TRAIN)
        t.train()
        folders = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
        states = [transformers.TrainerState.load_from_json(os.path.join(out, d, "trainer_state.json"))
                  for d in folders]
        return folders, [(s.global_step, s.max_steps, [{k: v for k, v in r.items() if "runtime" not in k
                                                        and "per_second" not in k} for r in s.log_history])
                         for s in states]
    hf, tf = both(run, tmp_path)
    assert_same(hf, tf)


def test_save_total_limit_F_HF_1(tmp_path):
    """F-HF-1: save_total_limit keeps the same newest folders."""
    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(), args=args_for(m, out, save_strategy="steps", save_steps=2,
                                                               save_total_limit=2), train_dataset=TRAIN)
        t.train()
        return sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
    hf, tf = both(run, tmp_path)
    assert hf == tf


def test_resume_same_as_transformers_F_HF_1(tmp_path):
    """F-HF-1: resume_from_checkpoint of an own mid-run checkpoint ends with transformers' weights and the same
    log rows. Documented difference: taskfit restores the loss sum of the steps since the last log, so the first
    logged ``loss`` after the resume and ``train_loss`` are those of a run that never stopped; HF averages only
    the steps after the resume (asserted as such)."""
    def run(m, out, resume):
        m.set_seed(42)
        args = args_for(m, out, save_strategy="steps", save_steps=3, logging_steps=2)
        t = m.Trainer(model=RegressionModel(), args=args, train_dataset=TRAIN)
        if resume:
            m.Trainer(model=RegressionModel(), args=args, train_dataset=TRAIN).train()
            m.set_seed(42)
        r = t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3") if resume else None)
        return summary(t, r)
    hf, tf = both(lambda m, out: run(m, out, True), tmp_path)
    assert_same(hf["weights"], tf["weights"])
    hf_rows, tf_rows = hf["log_history"], tf["log_history"]
    assert [sorted(r) for r in hf_rows] == [sorted(r) for r in tf_rows]
    assert [r.get("step") for r in hf_rows] == [r.get("step") for r in tf_rows]
    uninterrupted = run(__import__("taskfit.hf", fromlist=["x"]), str(tmp_path / "straight"), False)
    first_after = next(i for i, r in enumerate(tf_rows) if r.get("step", 0) > 3 and "loss" in r)
    assert tf_rows[first_after]["loss"] == next(r["loss"] for r in uninterrupted["log_history"]
                                                 if r.get("step") == tf_rows[first_after]["step"])
    assert tf["train_output"][1] == uninterrupted["train_output"][1]
