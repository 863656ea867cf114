"""Background (async) saves under the sharded strategies (F-REL-2, F-CKPT-5): FSDP (torch.distributed.checkpoint
shards) and DeepSpeed ZeRO-2 (engine files) with ``checkpoint_io="async"`` and ``save_total_limit`` finish without
hanging, and a SIGKILL of every rank while a background save may be in flight resumes to the uninterrupted run's
weights and losses. 2 real processes each (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from proc import clean_env, complete_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
STRATEGIES = Path(__file__).resolve().parent.parent / "strategies"
ASYNC = {"checkpoint_io": "async", "save_total_limit": 2}


def _run(job: str, tmp: Path, name: str, cfg: dict, expect_kill: bool = False, out: str | None = None) -> list[dict]:
    cfg = {"out": out or str(tmp / name), "result": str(tmp / f"{name}.pt"), **cfg}
    (tmp / f"{name}.json").write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, str(STRATEGIES / job), str(tmp / f"{name}.json")], capture_output=True,
                          text=True, timeout=400, env=clean_env(), cwd=tmp, start_new_session=True)
    if expect_kill:
        assert proc.returncode == -9, proc.stderr[-3000:]
        return []
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(tmp / f"{name}.rank{r}.pt", weights_only=False) for r in range(cfg.get("devices", 1))]


def _losses(result: dict) -> list[float]:
    return [r["loss"] for r in result["log"] if "loss" in r]


def test_F_REL_2_fsdp_async_saves_rotate_and_a_kill_resumes_exactly(tmp_path):
    base = {"bs": 2, "steps": 10, "devices": 2, "strategy": "fsdp"}
    args = {"fsdp": "full_shard auto_wrap", "save_strategy": "steps", "save_steps": 3}
    (ref, _) = _run("fsdp_job.py", tmp_path, "ref", {**base, "args": args})
    (done, _) = _run("fsdp_job.py", tmp_path, "async", {**base, "args": {**args, **ASYNC}})
    assert complete_checkpoints(tmp_path / "async") == [9, 10] and not list((tmp_path / "async").glob("*.tmp"))
    assert all(torch.equal(v, done["weights"][k]) for k, v in ref["weights"].items())
    _run("fsdp_job.py", tmp_path, "killed", {**base, "args": {**args, **ASYNC}, "kill": 7}, expect_kill=True)
    assert complete_checkpoints(tmp_path / "killed")[-1:] in ([], [3], [6])
    (resumed, _) = _run("fsdp_job.py", tmp_path, "resumed", {**base, "args": {**args, **ASYNC}, "resume": True},
                        out=str(tmp_path / "killed"))
    assert all(torch.equal(v, resumed["weights"][k]) for k, v in ref["weights"].items())
    assert _losses(resumed) == _losses(ref)[-len(_losses(resumed)):]


def test_F_REL_2_deepspeed_async_saves_rotate_and_a_kill_resumes_exactly(tmp_path):
    pytest.importorskip("deepspeed")
    base = {"bs": 2, "accum": 3, "n": 40, "steps": 8, "max_grad_norm": 0.5, "strategy": "deepspeed_stage_2",
            "devices": 2, "rank_seed": 1, "save_steps": 3}
    ref = _run("deepspeed_job.py", tmp_path, "ref", {**base, "args": {"warmup_steps": 2}})
    done = _run("deepspeed_job.py", tmp_path, "async", {**base, "args": {"warmup_steps": 2, **ASYNC}})
    assert complete_checkpoints(tmp_path / "async") == [6, 8]
    assert all(torch.equal(v, done[0]["weights"][k]) for k, v in ref[0]["weights"].items())
    _run("deepspeed_job.py", tmp_path, "killed", {**base, "args": {"warmup_steps": 2, **ASYNC}, "kill_after_step": 7},
         expect_kill=True)
    resumed = _run("deepspeed_job.py", tmp_path, "resumed",
                   {**base, "args": {"warmup_steps": 2, **ASYNC}, "resume": True}, out=str(tmp_path / "killed"))
    for want, got in zip(ref, resumed):
        assert all(torch.equal(v, got["weights"][k]) for k, v in want["weights"].items())
        assert all(torch.equal(a, b) for a, b in zip(want["optimizer"], got["optimizer"]))
        assert got["log"] == want["log"] and got["loss"] == want["loss"]
