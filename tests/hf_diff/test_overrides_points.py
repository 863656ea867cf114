"""Every HF ``Trainer`` subclass override point, run under ``transformers.Trainer`` and ``taskfit.hf.Trainer``
(F-HF-1): the same subclass records the same calls (arguments included) and trains, evaluates and predicts to the
same weights (exact, fp32 CPU), log history, metrics and predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, assert_same, both, stable, summary  # noqa: E402

TRAIN = RegressionDataset(length=32)
EVAL = RegressionDataset(length=16, seed=1)


def collate(items):
    """The scenarios' own collator (identical under both): dict of stacked float32 tensors."""
    return {k: torch.tensor(np.stack([it[k] for it in items])) for k in items[0]}


def _run(m, out, methods, after=None, trainer_kw=None, **kw):
    """Train a subclass of ``m.Trainer`` with ``methods`` (name -> function of ``calls``); then ``after(trainer)``
    (evaluate/predict) whose result is compared too."""
    m.set_seed(42)
    calls: list = []
    cls = type("Sub", (m.Trainer,), {name: make(calls) for name, make in methods.items()})
    t = cls(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=TRAIN, eval_dataset=EVAL,
            **(trainer_kw or {}))
    r = t.train()
    extra = after(t) if after is not None else None
    return summary(t, r), calls, extra


def _compare(tmp_path, methods, after=None, called=True, trainer_kw=None, **kw):
    hf, tf = both(lambda m, out: _run(m, out, methods, after, trainer_kw, **kw), tmp_path)
    assert bool(hf[1]) is called, f"override {'not ' if called else ''}called under transformers: {hf[1]}"
    assert_same(hf, tf)
    return hf, tf


# --------------------------------------------------------------------------------------------- loaders ---
def _train_loader(calls):
    def get_train_dataloader(self):
        calls.append(("get_train_dataloader", len(self.train_dataset)))
        return DataLoader(self.train_dataset, batch_size=4, shuffle=False, collate_fn=collate)
    return get_train_dataloader


def _eval_loader(calls):
    def get_eval_dataloader(self, eval_dataset=None):
        calls.append(("get_eval_dataloader", None if eval_dataset is None else len(eval_dataset)))
        data = eval_dataset if eval_dataset is not None else self.eval_dataset
        return DataLoader(torch.utils.data.Subset(data, range(12)), batch_size=4, collate_fn=collate)
    return get_eval_dataloader


def _test_loader(calls):
    def get_test_dataloader(self, test_dataset):
        calls.append(("get_test_dataloader", len(test_dataset)))
        return DataLoader(torch.utils.data.Subset(test_dataset, range(6)), batch_size=3, collate_fn=collate)
    return get_test_dataloader


def _predict(t):
    p = t.predict(EVAL)
    return p.predictions, p.label_ids, stable(p.metrics)


def test_get_train_dataloader_F_HF_1(tmp_path):
    """F-HF-1: the override's loader (unshuffled, batch 4) is what train() iterates: 8 steps per epoch."""
    hf, _ = _compare(tmp_path, {"get_train_dataloader": _train_loader})
    assert hf[1] == [("get_train_dataloader", 32)] and hf[0]["global_step"] == 16


def test_get_eval_dataloader_during_training_and_evaluate_F_HF_1(tmp_path):
    """F-HF-1: every evaluation during training and ``evaluate()`` build their loader with the override (12 of the
    16 eval samples here), with the same arguments as HF."""
    hf, _ = _compare(tmp_path, {"get_eval_dataloader": _eval_loader}, after=lambda t: stable(t.evaluate()),
                     eval_strategy="steps", eval_steps=4)
    assert hf[1] == [("get_eval_dataloader", 16)] * 3  # HF passes self.eval_dataset


def test_get_test_dataloader_and_predict_F_HF_1(tmp_path):
    """F-HF-1: ``predict`` builds its loader with ``get_test_dataloader(test_dataset)``."""
    hf, _ = _compare(tmp_path, {"get_test_dataloader": _test_loader}, after=_predict)
    assert hf[1] == [("get_test_dataloader", 16)] and len(hf[2][0]) == 6


# ----------------------------------------------------------------------------------- optimizer / schedule ---
def _create_optimizer(calls):
    def create_optimizer(self, model=None):
        calls.append(("create_optimizer", self.optimizer is None))
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        return self.optimizer
    return create_optimizer


def _create_scheduler(calls):
    def create_scheduler(self, num_training_steps, optimizer=None):
        # (HF hands the accelerate-wrapped optimizer here, taskfit the optimizer itself: both are Optimizers)
        calls.append(("create_scheduler", num_training_steps, optimizer is None,
                      isinstance(self.optimizer, torch.optim.Optimizer)))
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer,
                                                              lambda step: 0.5 ** (step // 2))
        return self.lr_scheduler
    return create_scheduler


def _create_both(calls):
    def create_optimizer_and_scheduler(self, num_training_steps):
        calls.append(("create_optimizer_and_scheduler", num_training_steps))
        raise AssertionError("train() does not call create_optimizer_and_scheduler (HF 5)")
    return create_optimizer_and_scheduler


def test_create_optimizer_F_HF_1(tmp_path):
    """F-HF-1: the override's SGD (momentum) trains, under the arguments' linear schedule."""
    hf, _ = _compare(tmp_path, {"create_optimizer": _create_optimizer})
    assert hf[1] == [("create_optimizer", True)]


def test_create_scheduler_F_HF_1(tmp_path):
    """F-HF-1: the override's schedule (halving every 2 steps) is stepped and logged; it gets ``max_steps``."""
    hf, _ = _compare(tmp_path, {"create_scheduler": _create_scheduler}, logging_steps=1)
    assert hf[1] == [("create_scheduler", 8, True, True)]


def test_create_optimizer_and_scheduler_not_called_by_train_F_HF_1(tmp_path):
    """F-HF-1: as in transformers 5, ``train()`` calls ``create_optimizer`` and ``create_scheduler`` but never
    ``create_optimizer_and_scheduler``; calling it by hand sets both."""
    _compare(tmp_path, {"create_optimizer_and_scheduler": _create_both}, called=False)
    import taskfit.hf as m

    t = m.Trainer(model=RegressionModel(), args=args_for(m, str(tmp_path / "x")), train_dataset=TRAIN)
    t.create_optimizer_and_scheduler(num_training_steps=10)
    assert type(t.optimizer).__name__ == "AdamW" and t.lr_scheduler.optimizer is t.optimizer


# ------------------------------------------------------------------------------------------------- steps ---
def _training_step_scaled(calls):
    def training_step(self, model, inputs, num_items_in_batch=None):
        calls.append(("training_step", sorted(inputs), num_items_in_batch))
        model.train()
        inputs = self._prepare_inputs(inputs)  # HF's private helper, which overrides often call
        loss = self.compute_loss(model, inputs)
        loss = 3.0 * loss / self.args.gradient_accumulation_steps  # a scaled loss changes the weights
        loss.backward()
        return loss.detach()
    return training_step


def _training_step_penalty(calls):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super(type(self), self).training_step(model, inputs, num_items_in_batch)
        penalty = 0.05 * model.a ** 2  # an extra term with its own backward, as HF users write it
        penalty.backward()
        calls.append(float(loss))
        return loss + penalty.detach()
    return training_step


@pytest.mark.parametrize("make,kw", [(_training_step_scaled, {"gradient_accumulation_steps": 2}),
                                     (_training_step_penalty, {})], ids=["scaled", "super_plus_penalty"])
def test_training_step_F_HF_1(make, kw, tmp_path):
    """F-HF-1: a training_step override (own backward, or super() plus a penalty) changes the trained weights and
    the logged loss as under transformers."""
    hf, _ = _compare(tmp_path, {"training_step": make}, **kw)
    assert len(hf[1]) == 8  # one call per micro-batch


def _prediction_step(calls):
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        calls.append(("prediction_step", sorted(inputs), prediction_loss_only, ignore_keys))
        loss, logits, labels = super(type(self), self).prediction_step(model, inputs, prediction_loss_only,
                                                                       ignore_keys)
        return loss * 2, (None if logits is None else logits * 10), labels
    return prediction_step


def _metrics(p):
    return {"mean_pred": float(np.mean(p.predictions)), "mean_label": float(np.mean(p.label_ids))}


def test_prediction_step_F_HF_1(tmp_path):
    """F-HF-1: the override's (loss, logits, labels) give eval_loss, compute_metrics' input and predict()'s
    predictions; ``prediction_loss_only`` and ``ignore_keys`` arrive as HF passes them."""
    def after(t):
        return stable(t.evaluate(ignore_keys=["x"])), _predict(t)
    hf, _ = _compare(tmp_path, {"prediction_step": _prediction_step}, after=after,
                     trainer_kw={"compute_metrics": _metrics}, eval_strategy="epoch")
    assert ("prediction_step", ["input_x", "labels"], False, ["x"]) in hf[1]


def _evaluate(calls):
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        calls.append(("evaluate", eval_dataset is None, ignore_keys, metric_key_prefix))
        metrics = super(type(self), self).evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        metrics[f"{metric_key_prefix}_custom"] = float(-self.state.global_step % 3)
        return metrics
    return evaluate


def test_evaluate_override_used_during_training_F_HF_1(tmp_path):
    """F-HF-1: evaluations during training go through the ``evaluate`` override (HF's _maybe_log_save_evaluate):
    its extra metric picks the best step (``metric_for_best_model``)."""
    def after(t):
        return t.state.best_metric, t.state.best_global_step
    hf, _ = _compare(tmp_path, {"evaluate": _evaluate}, after=after, eval_strategy="steps", eval_steps=2,
                     metric_for_best_model="custom", greater_is_better=True)
    assert hf[1] == [("evaluate", True, None, "eval")] * 4 and hf[2] == (2.0, None)  # no saves: no best step


def _predict_override(calls):
    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
        calls.append(("predict", len(test_dataset), metric_key_prefix))
        out = super(type(self), self).predict(test_dataset, ignore_keys, metric_key_prefix)
        return out._replace(predictions=out.predictions + 1)
    return predict


def test_predict_override_and_preprocess_logits_F_HF_1(tmp_path):
    """F-HF-1: a predict override returns its PredictionOutput; ``preprocess_logits_for_metrics`` applies in
    ``predict()`` too (HF's evaluation_loop)."""
    def after(t):
        p = t.predict(EVAL, metric_key_prefix="pred")
        return p.predictions, p.label_ids, stable(p.metrics), type(p).__name__
    hf, _ = _compare(tmp_path, {"predict": _predict_override}, after=after,
                     trainer_kw={"preprocess_logits_for_metrics": lambda logits, labels: logits * 2 + labels,
                                 "compute_metrics": _metrics})
    assert hf[1] == [("predict", 16, "pred")] and hf[2][3] == "PredictionOutput"


class NamedInputModel(RegressionModel):
    main_input_name = "input_x"  # what include_for_metrics=["inputs"] passes (HF: the model's main_input_name)


def test_include_for_metrics_inputs_and_loss_F_HF_1(tmp_path):
    """F-HF-1: ``include_for_metrics=["inputs", "loss"]`` gives compute_metrics the model's ``main_input_name``
    column as ``.inputs`` and each sample's batch loss as ``.losses``."""
    def scenario(m, out):
        seen = []

        def metrics(p):
            seen.append((p.inputs, p.losses, len(tuple(p))))
            return {"n": float(len(p.inputs))}
        m.set_seed(42)
        args = args_for(m, out, max_steps=2)
        args.include_for_metrics = ["inputs", "loss"]
        t = m.Trainer(model=NamedInputModel(), args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                      compute_metrics=metrics)
        t.train()
        return stable(t.evaluate()), seen
    hf, tf = both(scenario, tmp_path)
    np.testing.assert_array_equal(hf[1][0][0], EVAL.x)
    assert hf[1][0][1].shape == (16,) and hf[1][0][2] == 4
    assert_same(hf, tf)


# ------------------------------------------------------------------------------- every override at once ---
def _all_overrides(m, out):
    """The subclass of the multi-process job (overrides_all_job.py) with every override point, single process."""
    from overrides_all_job import subclass

    m.set_seed(42)
    calls: list = []
    args = args_for(m, out, per_device_train_batch_size=4, per_device_eval_batch_size=4, num_train_epochs=1,
                    logging_steps=2, eval_strategy="steps", eval_steps=2, learning_rate=0.01,
                    lr_scheduler_type="constant", max_grad_norm=0.0)
    t = subclass("override", calls, m)(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16),
                                       eval_dataset=RegressionDataset(length=8, seed=1))
    r = t.train()
    p = t.predict(RegressionDataset(length=4, seed=2))
    return summary(t, r), calls, p.predictions


def test_every_override_point_at_once_F_HF_1(tmp_path):
    """F-HF-1: a subclass overriding every override point (the one the DDP / DeepSpeed jobs run) records the same
    calls in the same order, with the same log rows as each log() override receives them, and trains, logs and
    predicts as under transformers."""
    hf, tf = both(_all_overrides, tmp_path)
    assert_same(hf, tf)
    assert [c[0] for c in hf[1]][:3] == ["get_train_dataloader", "create_optimizer", "create_scheduler"]
    assert "create_optimizer_and_scheduler" not in [c[0] for c in hf[1]]
