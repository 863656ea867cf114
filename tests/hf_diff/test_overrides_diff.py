"""Subclass override points called as transformers.Trainer calls them (F-HF-1): the same subclass of
``transformers.Trainer`` and of ``taskfit.hf.Trainer`` records the same calls and trains to the same weights."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, assert_same, both, summary  # noqa: E402

TRAIN = RegressionDataset(length=32)
EVAL = RegressionDataset(length=16, seed=1)


def _run(m, out, overrides, **kw):
    m.set_seed(42)
    calls: list = []
    cls = type("Sub", (m.Trainer,), {name: make(calls) for name, make in overrides.items()})
    t = cls(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=TRAIN, eval_dataset=EVAL)
    r = t.train()
    return summary(t, r), calls


def _log(calls):
    def log(self, logs, *args, **kwargs):
        calls.append(sorted(logs))
        logs["extra"] = 1.0
        return super(type(self), self).log(logs, *args, **kwargs)
    return log


def _compute_loss(calls):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        calls.append(sorted(inputs))
        out = model(input_x=inputs["input_x"])
        loss = torch.nn.functional.l1_loss(out[0], inputs["labels"])
        return (loss, out) if return_outputs else loss
    return compute_loss


@pytest.mark.parametrize("name,make,kw", [
    ("log", _log, {}),
    ("compute_loss", _compute_loss, {}),
], ids=["log", "compute_loss"])
def test_override_called_as_hf_F_HF_1(name, make, kw, tmp_path):
    """F-HF-1: overriding the method changes training as under transformers (same calls, weights, logs)."""
    hf, tf = both(lambda m, out: _run(m, out, {name: make}, **kw), tmp_path)
    assert hf[1], "the override must be called"
    assert_same(hf, tf)
