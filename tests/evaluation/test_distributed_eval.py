"""F-EVAL-2 / F-STRAT-8 across real processes: 2 CPU processes on gloo evaluate sklearn digits through a
minimal test strategy on the Strategy API (the real DDP strategy lands with issue #5; this exercises the
gathering and rank-zero logging code against real collectives)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from taskfit import Fit

sys.path.insert(0, os.path.dirname(__file__))
from eval_dist_worker import accuracy, make_module, worker  # noqa: E402
from eval_digits_data import DigitClassifier, digits  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # ~25 s: two spawned processes


def test_distributed_evaluation_equals_single_process_in_order_F_EVAL_2(tmp_path):
    """F-EVAL-2: predictions and labels gathered from 2 processes equal single-process evaluation exactly and
    in dataset order (397 samples: the distributed sampler's repeated sample is dropped; per-batch lists too);
    compute_metrics sees all samples once; the returned torchmetrics object syncs across processes (396
    samples, no repeats: same accuracy); eval_loss equals the single-process loss; batch_eval_metrics sees
    each batch gathered from both processes, every sample once.
    F-STRAT-8: only rank 0 writes logs (rank 1's logging_dir is never created)."""
    train, ev = digits()
    module = DigitClassifier()
    fit = Fit(output_dir=str(tmp_path / "single"), disable_tqdm=True, report_to="none", save_strategy="no",
              max_steps=30, learning_rate=0.5, optim="sgd", per_device_train_batch_size=32,
              per_device_eval_batch_size=16, label_names=["digit"], compute_metrics=accuracy)
    fit.fit(module, train)
    weights = str(tmp_path / "weights.pt")
    torch.save(module.state_dict(), weights)
    single = make_module(weights)
    expected = {}
    for n in (397, 396):
        m = fit.evaluate(single, ev[:n])
        p = fit.predict(single, ev[:n])
        expected[n] = (m, p)

    mp.spawn(worker, args=(2, str(tmp_path / "init"), str(tmp_path), weights), nprocs=2, join=True)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    for res in ranks:
        for n in (397, 396):
            m, p = expected[n]
            got = res[f"pred_{n}"]
            assert got.shape == (n, 10)
            np.testing.assert_array_equal(got, p.predictions)
            np.testing.assert_array_equal(res[f"labels_{n}"], p.label_ids)
            assert int(res[f"n_{n}"]) == n and float(res[f"acc_{n}"]) == m["eval_accuracy"]
        assert float(res["tm_396"]) == pytest.approx(expected[396][0]["eval_tm_accuracy"], abs=1e-6)
        assert float(res["loss_396"]) == pytest.approx(expected[396][0]["eval_loss"], rel=1e-5)
        assert res["per_batch_rows"].sum() == 397 and len(res["per_batch_rows"]) == 13  # 199 per rank / 16
        assert int(res["batch_metric_rows"]) == 397  # batch_eval_metrics: every sample once, across ranks
    assert (tmp_path / "logs-rank0" / "metrics.csv").is_file()
    assert not (tmp_path / "logs-rank1").exists()
