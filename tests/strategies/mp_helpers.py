"""Running ``mp_job.py`` in fresh processes and comparing its results (shared by the model-parallel and
resharding tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5


def run_job(tmp_path, name: str, expect_kill: bool = False, script: str = "mp_job.py", **cfg) -> dict:
    """Run ``script`` (``mp_job.py``) with ``cfg`` (``devices`` processes); rank 0's result (``{"stderr"}`` when
    it failed as expected)."""
    out = tmp_path / name
    cfg = {"out": str(out), "result": str(tmp_path / f"{name}.pt"), **cfg}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": HERE}
    proc = subprocess.run([sys.executable, os.path.join(HERE, script), str(path)], env=env,
                          capture_output=True, text=True, timeout=400)
    if expect_kill:
        assert proc.returncode != 0, proc.stdout[-2000:]
        return {"stderr": proc.stderr}
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(str(tmp_path / f"{name}.rank0.pt"), weights_only=False)


def max_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two state dicts with the same keys (nested dicts allowed)."""
    assert sorted(a) == sorted(b)
    worst = 0.0
    for k in a:
        if isinstance(a[k], dict):
            worst = max(worst, max_diff(a[k], b[k]))
        elif isinstance(a[k], torch.Tensor):
            worst = max(worst, (a[k].float() - b[k].float()).abs().max().item())
        else:
            assert a[k] == b[k], k
    return worst


def optim_diff(a: dict, b: dict) -> float:
    """Largest difference between two name-keyed optimizer states (``exp_avg``, ``exp_avg_sq``, ``step`` per
    parameter); their hyperparameters must be equal."""
    assert [{k: v for k, v in g.items() if k != "params"} for g in a["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in b["param_groups"]]
    return max_diff(a["state"], b["state"])


def losses(result: dict) -> list[float]:
    return [r["loss"] for r in result["log"] if "loss" in r]


def norms(result: dict) -> list[float]:
    return [r["grad_norm"] for r in result["log"] if "grad_norm" in r]
