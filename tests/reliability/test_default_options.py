"""The default-options matrix (issue 30; F-CORE-4, F-STRAT-1, F-SCALE-1): every strategy and every door trains a
small model with DEFAULT arguments only (``output_dir``, ``max_steps=3``, the strategy name, ``devices``; FSDP's
sharding variants add ``fsdp=<variant>``) and ends equal to a plain-torch reference within tolerance
(``default_job.reference``: full-batch AdamW with HF's defaults and the default linear schedule). Tests set options
of their own choosing elsewhere; this module is where the next crash of the defaults users get is found.

Single-process cases run in this process (default suite). Multi-process cases start real gloo processes
(``devices=2``) and are ``distributed`` and ``slow`` (``make test-dist``); DeepSpeed cases are ``deepspeed`` too.
The Lightning door (``taskfit.lightning.Trainer``) runs with Lightning's defaults; Lightning requires the module's
``configure_optimizers``, so its reference is the Engine's (AdamW, no schedule)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import default_job

STEPS = 3
TOL = 1e-6  # fp32: the same full-batch sums reduced in another order (measured below 1e-7)
DS_TOL = 1e-5  # DeepSpeed's own AdamW step arithmetic
HAS_DS = importlib.util.find_spec("deepspeed") is not None
HAS_XLA = importlib.util.find_spec("torch_xla") is not None


def _check(result: dict, world: int, door: str, tol: float = TOL) -> None:
    ref = default_job.reference(world, STEPS, schedule=door not in ("engine", "lightning"))
    init = default_job.MLP().state_dict()
    got = result["weights"]
    assert sorted(got) == sorted(ref)
    diff = max((got[k].float() - ref[k]).abs().max().item() for k in ref)
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    assert diff < tol, f"{door}: max weight difference {diff:.3g} to the reference"
    assert moved > 50 * TOL  # the comparison can tell a trained model from an untrained one
    assert result["steps"] == STEPS
    if door not in ("engine", "lightning"):  # the user's loop / configure_optimizers (Lightning requires it)
        assert result["optim"] == "adamw_torch_fused"  # the default, not one a test chose


# ---- one process, in this process (default suite) --------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["auto", "single_device"])
@pytest.mark.parametrize("door", ["fit", "hf", "engine", "lightning"])
def test_defaults_one_process_every_door_equals_the_reference(door, strategy, tmp_path):
    cfg = {"door": door, "out": str(tmp_path / "run"), "steps": STEPS, "strategy": strategy, "devices": 1,
           "world": 1}
    _check(default_job.DOORS[door](cfg), 1, door)


# ---- real processes ----------------------------------------------------------------------------------------------
def data_parallel_size(strategy: str, devices: int) -> int:
    """Processes reading different samples: all of them, except under tensor parallelism (``model_parallel``'s
    default mesh is 1 x devices on one machine: every process reads the same batch)."""
    return 1 if strategy == "model_parallel" else devices


def _run(tmp_path: Path, door: str, strategy: str, devices: int = 2, **options) -> dict:
    cfg = {"door": door, "out": str(tmp_path / "run"), "result": str(tmp_path / "result.pt"), "steps": STEPS,
           "strategy": strategy, "devices": devices, "world": data_parallel_size(strategy, devices),
           "options": options}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    env.update(OMP_NUM_THREADS="1", TASKFIT_DEEPSPEED_SHM_COMM="0", PYTHONPATH=str(HERE))
    proc = subprocess.run([sys.executable, str(HERE / "default_job.py"), str(path)], capture_output=True, text=True,
                          timeout=400, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(tmp_path / "result.pt", weights_only=False)


DS = [pytest.mark.deepspeed, pytest.mark.skipif(not HAS_DS, reason="DeepSpeed is not installed")]
FIT_CASES = [
    pytest.param("ddp", {}, id="ddp"),
    pytest.param("ddp_spawn", {}, id="ddp_spawn"),
    pytest.param("fsdp", {}, id="fsdp"),
    pytest.param("fsdp", {"fsdp": "shard_grad_op"}, id="fsdp-shard_grad_op"),
    pytest.param("fsdp", {"fsdp": "no_shard"}, id="fsdp-no_shard"),
    pytest.param("fsdp", {"fsdp": "hybrid_shard"}, id="fsdp-hybrid_shard"),
    pytest.param("fsdp2", {}, id="fsdp2"),
    pytest.param("model_parallel", {}, id="model_parallel"),
    *[pytest.param(f"deepspeed_stage_{s}", {}, id=f"deepspeed_stage_{s}", marks=DS) for s in (1, 2, 3)],
    pytest.param("xla", {}, id="xla", marks=[pytest.mark.xla, pytest.mark.skipif(
        not HAS_XLA, reason="torch_xla is not installed (XLA runs only where torch_xla does)")]),
]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "options"), FIT_CASES)
def test_defaults_fit_two_processes_equal_the_reference(strategy, options, tmp_path):
    tol = DS_TOL if strategy.startswith("deepspeed") else TOL
    _check(_run(tmp_path, "fit", strategy, **options), data_parallel_size(strategy, 2), "fit", tol)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_defaults_hf_trainer_two_processes_equal_the_reference(strategy, tmp_path):
    _check(_run(tmp_path, "hf", strategy), 2, "hf")


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_defaults_engine_two_processes_equal_the_reference(strategy, tmp_path):
    _check(_run(tmp_path, "engine", strategy), 2, "engine")


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_defaults_lightning_trainer_two_processes_equal_the_reference(strategy, tmp_path):
    _check(_run(tmp_path, "lightning", strategy), 2, "lightning")


LIGHTNING_DOOR = "lightning"


def test_defaults_lightning_trainer_door():
    assert LIGHTNING_DOOR in default_job.DOORS, "add default_job.run_lightning for taskfit.lightning.Trainer"
