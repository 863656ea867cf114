"""The last HF ``Trainer`` behaviours of the drop-in, each run under ``transformers.Trainer`` and
``taskfit.hf.Trainer`` with the same user code (F-HF-1): a dict of eval datasets during training (one
``evaluate`` per dataset, one log row each), the ``num_items_in_batch`` a ``training_step`` override receives,
and the LOMO / AdaLomo optimizers (fused backward)."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, assert_same, both, stable, summary  # noqa: E402

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
