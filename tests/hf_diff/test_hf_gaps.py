"""F-HF-1: the gaps transformers' own Trainer tests found in ``taskfit.hf`` (tests/peers/hf_gaps.md), each asserted
against transformers itself as the oracle: the same scenario runs under ``transformers`` and under ``taskfit.hf``."""

from __future__ import annotations

import json
import logging
import os
from typing import Any
from unittest.mock import patch

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, both  # noqa: E402

TRAIN, EVAL = RegressionDataset(length=32), RegressionDataset(length=16, seed=1)


def _trainer(m: Any, out: str, callbacks: list | None = None, **kw: Any) -> Any:
    m.set_seed(42)
    return m.Trainer(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=TRAIN, eval_dataset=EVAL,
                     callbacks=callbacks)


def test_callback_handler_is_the_live_list_G1_F_HF_1(tmp_path):
    """G1: ``trainer.callback_handler.callbacks`` holds the callbacks; add/remove change it; adding a second
    callback of one class warns naming the class on HF's ``transformers.trainer_callback`` logger."""
    def run(m, out):
        class Recorder(m.TrainerCallback):
            pass

        t = _trainer(m, out)
        n = len(t.callback_handler.callbacks)
        t.add_callback(Recorder)
        mine = [cb for cb in t.callback_handler.callbacks if isinstance(cb, Recorder)]
        with patch.object(logging.getLogger("transformers.trainer_callback"), "warning") as warn:
            t.add_callback(Recorder())
        t.remove_callback(mine[0])
        return (len(t.callback_handler.callbacks) - n, mine[0] in t.callback_handler.callbacks, warn.called,
                "Recorder" in warn.call_args[0][0], "Recorder" in t.callback_handler.callback_list)
    hf, tf = both(run, tmp_path)
    assert hf == tf == (1, False, True, True, True)


def test_early_stopping_callback_has_hf_signature_G2_F_HF_1():
    """G2: ``EarlyStoppingCallback(1, 0.0001)`` binds HF's positional arguments; ``check_metric_value`` counts
    as HF's; ``state()`` is HF's dict."""
    import transformers

    import taskfit.hf

    class Args:
        greater_is_better = False

    def run(cls):
        cb = cls(2, 0.05)
        state = transformers.TrainerState()
        counters = []
        for value, best in ((1.0, None), (0.9, 1.0), (0.98, 0.9), (0.5, 0.9), (0.6, 0.5)):
            state.best_metric = best
            cb.check_metric_value(Args(), state, None, value)
            counters.append(cb.early_stopping_patience_counter)
        return cb.early_stopping_patience, cb.early_stopping_threshold, counters, cb.state()
    assert run(transformers.EarlyStoppingCallback) == run(taskfit.hf.EarlyStoppingCallback)
    assert run(taskfit.hf.EarlyStoppingCallback)[2] == [0, 0, 1, 0, 1]


def test_early_stopping_stops_at_hf_step_G2_F_HF_1(tmp_path):
    """G2: HF's class in a run stops at the same step with the same best metric as under transformers."""
    def run(m, out):
        t = _trainer(m, out, callbacks=[m.EarlyStoppingCallback(1, 0.0)], num_train_epochs=20, learning_rate=0.5,
                     eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                     load_best_model_at_end=True, metric_for_best_model="eval_loss")
        t.train()
        return t.state.global_step, t.state.best_metric
    hf, tf = both(run, tmp_path)
    assert hf == tf


def _stateful(m: Any) -> type:
    from transformers.trainer_callback import ExportableState

    class Stateful(m.TrainerCallback, ExportableState):
        def __init__(self, my_value: str = "default") -> None:
            self.my_value = my_value
            self.seen = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.seen += 1

        def state(self) -> dict:
            return {"args": {"my_value": self.my_value}, "attributes": {"seen": self.seen}}
    return Stateful


def test_stateful_callbacks_saved_and_restored_G3_F_HF_1(tmp_path):
    """G3: ``trainer_state.json`` ``stateful_callbacks`` as HF writes it (EarlyStoppingCallback and two instances of
    a user ExportableState callback, in order), restored with their ``args`` and ``attributes`` under
    ``restore_callback_states_from_checkpoint=True``; a saved state without a callback warns on HF's
    ``transformers.trainer`` logger naming the class."""
    def run(m, out):
        Stateful = _stateful(m)
        kw = dict(max_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
                  load_best_model_at_end=True)
        _trainer(m, out, [m.EarlyStoppingCallback(5, 0.2), Stateful("first"), Stateful("second")], **kw).train()
        with open(os.path.join(out, "checkpoint-2", "trainer_state.json")) as f:
            saved = json.load(f)["stateful_callbacks"]
        t = _trainer(m, out, [m.EarlyStoppingCallback(), Stateful(), Stateful()],
                     restore_callback_states_from_checkpoint=True, **kw)
        t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
        restored = list((type(cb).__name__, cb.state()["args"], cb.state()["attributes"])
                          for cb in t.callback_handler.callbacks if hasattr(cb, "state") and callable(cb.state))
        restored = sorted(restored, key=repr)
        t = _trainer(m, out, restore_callback_states_from_checkpoint=True, **kw)
        with patch.object(logging.getLogger("transformers.trainer"), "warning") as warn:
            t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
        warned = [c[0][0] for c in warn.call_args_list if "EarlyStoppingCallback" in c[0][0]]
        return saved, restored, bool(warned)
    hf, tf = both(run, tmp_path)
    # HF's list also holds the states of an earlier save point (HF appends to state.stateful_callbacks; its
    # restore reads the first entries): the args of the instances, in order, are what both restore
    assert hf[0]["EarlyStoppingCallback"]["args"] == tf[0]["EarlyStoppingCallback"]["args"]
    assert [s["args"] for s in hf[0]["Stateful"][:2]] == [s["args"] for s in tf[0]["Stateful"]]
    assert [r[:2] for r in hf[1]] == [r[:2] for r in tf[1]] and hf[2] == tf[2] is True
    assert [s["args"]["my_value"] for s in tf[0]["Stateful"]] == ["first", "second"]


def test_trainer_state_json_api_G5_F_HF_1(tmp_path):
    """G5: ``TrainerState.save_to_json``/``load_from_json`` read each other's files with transformers';
    ``compute_steps`` and ``TrainerControl.state()`` as HF's; ``trainer.state`` is settable."""
    import transformers

    import taskfit.hf

    ours = taskfit.hf.TrainerState(epoch=1.5, global_step=100, max_steps=200, best_metric=0.95)
    ours.save_to_json(str(tmp_path / "tf.json"))
    theirs = transformers.TrainerState.load_from_json(str(tmp_path / "tf.json"))
    assert (theirs.epoch, theirs.global_step, theirs.max_steps, theirs.best_metric) == (1.5, 100, 200, 0.95)
    theirs.save_to_json(str(tmp_path / "hf.json"))
    back = taskfit.hf.TrainerState.load_from_json(str(tmp_path / "hf.json"))
    assert (back.epoch, back.global_step, back.max_steps, back.best_metric) == (1.5, 100, 200, 0.95)

    class Args:
        logging_steps, eval_steps, save_steps = 0.1, 20, 0.5

    steps = []
    for state in (transformers.TrainerState(), taskfit.hf.TrainerState()):
        state.compute_steps(Args(), max_steps=99)
        steps.append((state.logging_steps, state.eval_steps, state.save_steps))
    assert steps[0] == steps[1] == [(10, 20, 50)][0]
    flags = dict(should_training_stop=True, should_save=True)
    assert transformers.TrainerControl(**flags).state() == taskfit.hf.TrainerControl(**flags).state()
    t = taskfit.hf.Trainer(RegressionModel(), args_for(taskfit.hf, str(tmp_path / "out")))
    t.state = back
    assert t.state is back


def test_epoch_end_flags_before_user_callbacks_G4_F_HF_1(tmp_path):
    """G4: a user callback's ``on_epoch_end`` sees the flags HF's DefaultFlowCallback raised (save, evaluate, log at
    the end of the epoch), and saves are counted once with ``save_strategy="epoch"``."""
    def run(m, out):
        seen = []

        class Flags(m.TrainerCallback):
            def on_epoch_end(self, args, state, control, **kwargs):
                seen.append((state.global_step, control.should_save, control.should_evaluate, control.should_log))

        _trainer(m, out, [Flags()], save_strategy="epoch", eval_strategy="epoch", logging_strategy="epoch").train()
        _trainer(m, out + "2", [Flags()], max_steps=2, save_strategy="epoch").train()
        return seen
    hf, tf = both(run, tmp_path)
    assert hf == tf == [(4, True, True, True), (8, True, True, True), (2, True, False, False)]


def test_callback_kwargs_G5_F_HF_1(tmp_path):
    """G5: every event gets HF's keyword arguments (``model``, ``processing_class``, ``optimizer``,
    ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader``, plus ``metrics``/``logs`` where HF passes them)."""
    def run(m, out):
        got: dict[str, set] = {}

        class Kw(m.TrainerCallback):
            pass

        for name in ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_step_end",
                     "on_epoch_end", "on_log", "on_evaluate", "on_save", "on_train_end"):
            setattr(Kw, name, lambda self, args, state, control, _n=name, **kw: got.setdefault(_n, set(kw)) and None)
        _trainer(m, out, [Kw()], max_steps=2, eval_strategy="steps", eval_steps=2, logging_steps=1,
                 save_strategy="steps", save_steps=2).train()
        return got
    hf, tf = both(run, tmp_path)
    assert hf == tf
    assert tf["on_init_end"] >= {"model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader",
                                 "eval_dataloader"}


def test_trainer_api_G5_F_HF_1(tmp_path):
    """G5: ``get_num_trainable_parameters``, ``get_learning_rates``, ``get_optimizer_group``,
    ``get_decay_parameter_names``, ``model_wrapped`` (one object across two ``train()``) and the NamedTuple
    ``TrainOutput`` (``step, loss, metrics = trainer.train()``) as HF's."""
    def run(m, out):
        t = _trainer(m, out, max_steps=2)
        before = t.get_num_trainable_parameters()
        with pytest.raises(ValueError, match="optimizer is None"):
            t.get_learning_rates()
        step, loss, metrics = t.train()
        wrapped = t.model_wrapped
        t.train()
        group = t.get_optimizer_group(t.model.a)
        return (before, step, round(loss, 6), sorted(k for k in metrics if "runtime" not in k and k != "total_flos"),
                # HF keeps an empty no-decay group where taskfit builds none (same optimizer steps)
                [lr for lr, g in zip(t.get_learning_rates(), t.get_optimizer_group()) if g],
                [len(p) for p in t.get_optimizer_group() if p], sorted(group),
                t.get_decay_parameter_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))),
                t.model_wrapped is wrapped)
    hf, tf = both(run, tmp_path)
    assert hf == tf


def test_best_save_strategy_needs_metric_G8_F_HF_1(tmp_path):
    """G8: ``save_strategy="best"`` without ``metric_for_best_model`` raises HF's ValueError."""
    def run(m, out):
        with pytest.raises(ValueError) as err:
            _trainer(m, out, eval_strategy="epoch", save_strategy="best")
        return "`args.metric_for_best_model` must be provided" in str(err.value)
    assert list(both(run, tmp_path)) == [True, True]


def test_model_card_takes_hf_keywords_F_HF_1(tmp_path):
    """The model card and the push take HF's keywords (``run_classification.py`` ends with
    ``trainer.create_model_card(**kwargs)`` holding ``tasks``, ``language``, ``dataset_tags``...)."""
    import taskfit.hf

    t = _trainer(taskfit.hf, str(tmp_path / "out"), max_steps=1)
    t.train()
    card = t.create_model_card(language="en", license="apache-2.0", tags=["x"], model_name="m",
                               finetuned_from="base", tasks="text-classification", dataset_tags="glue",
                               dataset="glue mrpc", dataset_args="mrpc")
    text = (tmp_path / "out" / "README.md").read_text()
    assert text == card
    for line in ('language: "en"', 'license: "apache-2.0"', 'tasks: "text-classification"', 'dataset_tags: "glue"',
                 'dataset_args: "mrpc"', '"x"', "# m", "Fine-tuned from `base`"):
        assert line in text, line
