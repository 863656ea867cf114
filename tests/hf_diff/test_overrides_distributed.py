"""HF override points under real multi-process strategies (F-HF-1, F-STRAT-2): a ``taskfit.hf.Trainer`` subclass
overriding ``get_train_dataloader``, ``create_optimizer``, ``training_step`` and ``evaluate`` runs on 2 gloo
processes (DDP and FSDP, taskfit re-launching the script per rank); every rank calls every override, and the
``training_step`` override (loss x 3, its own backward through the wrapper) trains exactly as SGD with a 3x
learning rate does without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 4 two-process jobs, ~1 min on 2 cores
JOB = Path(__file__).parent / "overrides_ddp_job.py"


def _run(tmp_path: Path, mode: str, strategy: str) -> list[dict]:
    out = tmp_path / f"{mode}-{strategy}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    proc = subprocess.run([sys.executable, str(JOB), mode, str(out), strategy], capture_output=True, text=True,
                          timeout=300, env={**env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_overrides_called_in_every_worker_F_HF_1(strategy, tmp_path):
    """F-HF-1: each rank's loader is its share (32 samples / 2 ranks / batch 4 = 4 batches) from the
    get_train_dataloader override, the override's SGD trains, training_step runs per micro-batch on each rank and
    the evaluations during training (every 2 steps) go through the evaluate override."""
    ranks = _run(tmp_path, "override", strategy)
    reference = _run(tmp_path, "reference", strategy)
    expected = ([["get_train_dataloader", 4], ["create_optimizer", True]]
                + ([["training_step", 4]] * 2 + [["evaluate", ["epoch", "eval_loss"]]]) * 2)
    for r in ranks:
        assert r["world_size"] == 2 and r["calls"] == expected
        assert r["weights"] == ranks[0]["weights"]  # replicas stay identical
    assert [r["calls"] for r in reference] == [[["create_optimizer", True]]] * 2
    # loss x 3 in training_step == learning rate x 3 (plain SGD, no clipping): the override changed the training
    for name, value in ranks[0]["weights"].items():
        got, ref = _scalar(value), _scalar(reference[0]["weights"][name])
        assert abs(got) > 0.1 and abs(got - ref) <= 1e-6, (name, got, ref)


def _scalar(value: list) -> float:
    """The one number of a ``[[w]]`` weight or ``[b]`` bias list."""
    while isinstance(value, list):
        value = value[0]
    return value
