"""The last HF ``Trainer`` behaviours of the drop-in, each run under ``transformers.Trainer`` and
``taskfit.hf.Trainer`` with the same user code (F-HF-1): a dict of eval datasets during training (one
``evaluate`` per dataset, one log row each), the ``num_items_in_batch`` a ``training_step`` override receives,
and the LOMO / AdaLomo optimizers (fused backward)."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

import torch  # noqa: E402
from common import (RegressionDataset, RegressionModel, args_for, assert_same, both, stable, summary,  # noqa: E402
                    weights)

TRAIN = RegressionDataset(length=32)
EVAL_A = RegressionDataset(length=16, seed=1)
EVAL_B = RegressionDataset(a=1.0, b=-1.0, length=8, seed=2)  # whole batches: eval_loss exact


# ------------------------------------------------------------------------------- dict of eval datasets ---
def _dict_eval(m, out, **kw):
    m.set_seed(42)
    t = m.Trainer(model=RegressionModel(), args=args_for(m, out, eval_strategy="steps", eval_steps=3, max_steps=7,
                                                         **kw),
                  train_dataset=TRAIN, eval_dataset={"a": EVAL_A, "b": EVAL_B})
    r = t.train()
    after = stable(t.evaluate())
    return summary(t, r), after, t.state.best_metric, t.state.best_global_step


def test_dict_of_eval_datasets_logs_a_row_per_dataset_F_HF_1(tmp_path):
    """F-HF-1: ``eval_dataset={"a": .., "b": ..}``: every evaluation during training (steps 3, 6 and the final one
    at 7) and ``evaluate()`` after it log one row per dataset with ``eval_a_*`` / ``eval_b_*`` keys, and
    ``metric_for_best_model="a_loss"`` ranks on ``eval_a_loss``; log history, metrics and weights as HF."""
    hf, tf = both(lambda m, out: _dict_eval(m, out, metric_for_best_model="a_loss"), tmp_path)
    assert_same(hf, tf)
    rows = [r for r in hf[0]["log_history"] if any(k.startswith("eval_") for k in r)]
    assert [(r["step"], sorted(k for k in r if k.endswith("_loss"))) for r in rows] == [
        (s, [f"eval_{n}_loss"]) for s in (3, 6, 7, 7) for n in "ab"]
    assert sorted(k for k in hf[1] if k.endswith("_loss")) == ["eval_a_loss", "eval_b_loss"]
    assert hf[2] == min(r["eval_a_loss"] for r in rows[:6:2])


# ---------------------------------------------------------------------------------- num_items_in_batch ---
class KwargsRegressionModel(RegressionModel):
    """HF's ``RegressionModel`` shape with a ``forward`` taking ``**kwargs``: HF passes ``num_items_in_batch`` to
    it and the loss is the window's sum over that count (what HF then leaves undivided by the accumulation)."""

    def forward(self, input_x, labels=None, **kwargs):
        y = input_x * self.a + self.b
        if labels is None:
            return (y,)
        n = kwargs.get("num_items_in_batch")
        return (((y - labels) ** 2).sum() / (n if n is not None else labels.numel()), y)


def _sum_loss(outputs, labels, num_items_in_batch=None):
    """A ``compute_loss_func`` normalising by HF's count when it gets one (the mean otherwise)."""
    return ((outputs[0] - labels) ** 2).sum() / (num_items_in_batch if num_items_in_batch is not None
                                                 else labels.numel())


def _items_run(m, out, model_cls, loss_func):
    m.set_seed(42)
    seen: list = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        n = num_items_in_batch
        seen.append(None if n is None else (type(n).__name__, str(n.dtype), n.shape, float(n)))
        return m.Trainer.training_step(self, model, inputs, num_items_in_batch)

    cls = type("Sub", (m.Trainer,), {"training_step": training_step})
    t = cls(model=model_cls(), args=args_for(m, out, gradient_accumulation_steps=2, max_steps=3),
            train_dataset=TRAIN, compute_loss_func=loss_func)
    r = t.train()
    return summary(t, r), seen


@pytest.mark.parametrize("model_cls,loss_func,counted", [
    (RegressionModel, None, False), (KwargsRegressionModel, None, True), (RegressionModel, _sum_loss, True)],
    ids=["plain-forward", "forward-kwargs", "compute_loss_func"])
def test_training_step_override_gets_hf_num_items_in_batch_F_HF_1(tmp_path, model_cls, loss_func, counted):
    """F-HF-1: a ``training_step`` override receives HF's ``num_items_in_batch`` per micro-batch: the window's
    label count (16: two batches of 8, a float32 0-dim tensor) when the model's forward takes ``**kwargs`` or a
    ``compute_loss_func`` is given, else None; the run trains to the same weights and log as transformers (the
    counts and accumulation here are powers of two, so HF's sum / count and taskfit's weighted mean agree
    exactly)."""
    hf, tf = both(lambda m, out: _items_run(m, out, model_cls, loss_func), tmp_path)
    assert hf[1] == [("Tensor", "torch.float32", (), 16.0)] * 6 if counted else hf[1] == [None] * 6
    assert_same(hf, tf)


# ------------------------------------------------------------------------------------------ LOMO / AdaLomo ---
class LinearRegressionModel(RegressionModel):
    """``y = w x + b`` with an ``nn.Linear(1, 1)`` (1-D and 2-D parameters: AdaLomo factors each parameter's
    second moment by rows and columns and cannot take HF's 0-dim ``a``/``b``)."""

    def __init__(self) -> None:
        super().__init__()
        del self.a, self.b
        self.lin = torch.nn.Linear(1, 1)

    def forward(self, input_x, labels=None):
        y = self.lin(input_x.unsqueeze(-1)).squeeze(-1)
        return (y,) if labels is None else (torch.nn.functional.mse_loss(y, labels), y)


def _lomo_run(m, out, optim, model_cls, override, **kw):
    m.set_seed(42)
    methods = {}
    if override:  # an HF training_step override: its super() call runs the fused backward too
        def training_step(self, model, inputs, num_items_in_batch=None):
            return m.Trainer.training_step(self, model, inputs, num_items_in_batch) * 1.0
        methods["training_step"] = training_step
    cls = type("Sub", (m.Trainer,), methods)
    t = cls(model=model_cls(), args=args_for(m, out, optim=optim, max_steps=6, logging_steps=2, **kw),
            train_dataset=TRAIN)
    r = t.train()
    return summary(t, r)


@pytest.mark.parametrize("optim,override,kw", [
    ("lomo", False, {}), ("lomo", True, {"gradient_accumulation_steps": 2}), ("adalomo", False, {})],
    ids=["lomo", "lomo-override-accumulation", "adalomo"])
def test_lomo_optimizers_train_as_transformers_F_LOOP_4(tmp_path, monkeypatch, optim, override, kw):
    """F-LOOP-4: ``optim="lomo"`` / ``"adalomo"`` (lomo-optim) update the parameters inside
    ``fused_backward(loss, lr)`` with the step's learning rate, as HF's ``training_step`` and accelerate do: the
    same weights (exact), log history (``grad_norm`` 0.0: no gradients are left to clip) and TrainOutput as
    transformers, also through a ``training_step`` override and with accumulation. lomo-optim allocates AdaLomo's
    state with ``.cuda()``; without a GPU that call returns the CPU tensor, under both trainers alike."""
    pytest.importorskip("lomo_optim")
    import transformers.integrations.deepspeed as hf_ds

    # AdaLomo takes its ZeRO-3 path when any live transformers DeepSpeed config says ZeRO-3; one left alive by an
    # earlier test in the same process (a TrainingArguments(deepspeed=...) oracle) must not leak into this run
    monkeypatch.setattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    if optim == "adalomo" and not torch.cuda.is_available():
        monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    model_cls = LinearRegressionModel if optim == "adalomo" else RegressionModel
    hf, tf = both(lambda m, out: _lomo_run(m, out, optim, model_cls, override, **kw), tmp_path)
    assert [r.get("grad_norm") for r in hf["log_history"][:-1]] == [0.0] * 3
    assert_same(hf, tf)
    torch.manual_seed(42)
    start = weights(model_cls())
    assert any(not torch.equal(start[k], v) for k, v in tf["weights"].items())  # it trained
