"""A hand-written loop on the Engine against a plain PyTorch loop (F-ENGINE-2): 2 gloo processes under DDP, FSDP
and DeepSpeed ZeRO-2 with accumulation through ``no_backward_sync`` equal one process on the doubled batch, and a
loop killed with SIGKILL and restarted through ``engine.load`` ends equal to the uninterrupted loop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

HERE = Path(__file__).parent
JOB = HERE / "engine_job.py"
sys.path.insert(0, str(HERE))
import engine_job  # noqa: E402

TOL = 1e-6  # fp32: the same sums in another order


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED", "SLURM_NTASKS")}
    return {**env, "OMP_NUM_THREADS": "1", "TASKFIT_DEEPSPEED_SHM_COMM": "0"}


def run_job(tmp_path: Path, name: str, expect_kill: bool = False, **cfg) -> dict:
    """Run the job in fresh processes; rank 0's result (``{}`` when it was killed)."""
    cfg = {"result": str(tmp_path / name), **cfg}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, str(JOB), str(path)], capture_output=True, text=True, timeout=300,
                          env=_env(), cwd=tmp_path)
    if expect_kill:
        assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])
        return {}
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(tmp_path / f"{name}.rank0.pt", weights_only=False)


def reference(bs: int, accum: int, steps: int, clip: float | None = None) -> dict:
    """The plain PyTorch loop: one process, one batch of ``bs * accum`` samples per step, no Engine."""
    model = engine_job.make_model()
    optimizer = engine_job.make_optimizer(model)
    data = engine_job.dataset(bs * accum * steps)
    losses = []
    for step in range(steps):
        x, y = data.tensors[0][step * bs * accum:(step + 1) * bs * accum], data.tensors[1][step * bs * accum:
                                                                                          (step + 1) * bs * accum]
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def assert_close(got: dict, want: dict, tol: float = TOL) -> None:
    assert got["weights"].keys() == want["weights"].keys()
    for k, v in want["weights"].items():
        diff = (got["weights"][k] - v).abs().max().item()
        assert diff <= tol, (k, diff)
    assert got["losses"] == pytest.approx(want["losses"], abs=tol)


PARALLEL = {  # name: (strategy, Engine options, clip through engine.clip_gradients)
    "ddp": ("ddp", {"ddp_timeout": 120}, 0.5),
    "fsdp": ("fsdp", {"fsdp": "full_shard"}, 0.5),
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(PARALLEL))
def test_F_ENGINE_2_two_processes_with_accumulation_equal_one_process_on_the_doubled_batch(case, tmp_path):
    """2 gloo processes, micro-batch 2 per process, 2 micro-batches per step (the first under no_backward_sync),
    gradient clipping through the Engine: equal to a plain loop over batches of 8 within 1e-6."""
    strategy, options, clip = PARALLEL[case]
    got = run_job(tmp_path, case, strategy=strategy, devices=2, bs=2, accum=2, steps=4, clip=clip, options=options,
                  probe_sync=case == "ddp")
    assert got["world_size"] == 2 and got["strategy"] == strategy
    if case == "ddp":  # no_backward_sync really skipped the all-reduce of the first micro-batch
        assert got["probe"] == {"local_grads_differ": True}
    rank1 = torch.load(tmp_path / f"{case}.rank1.pt", weights_only=False)
    assert rank1["rank"] == 1 and rank1["losses"] == got["losses"]  # all_reduce: every rank sees the mean
    assert_close(got, reference(bs=4, accum=2, steps=4, clip=clip))
    assert_close(rank1, reference(bs=4, accum=2, steps=4, clip=clip))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.deepspeed
def test_F_ENGINE_2_deepspeed_zero2_two_processes_equal_one_process_on_the_doubled_batch(tmp_path):
    """DeepSpeed ZeRO-2: the optimizer step is the engine's (``optimizer.step()`` -> ``engine.step()``), clipping is
    the engine's (``max_grad_norm``), accumulation boundaries come from ``no_backward_sync``."""
    pytest.importorskip("deepspeed")
    got = run_job(tmp_path, "ds", strategy="deepspeed_stage_2", devices=2, bs=2, accum=2, steps=4,
                  options={"max_grad_norm": 0.5})
    assert got["strategy"] == "deepspeed" and got["world_size"] == 2
    assert_close(got, reference(bs=4, accum=2, steps=4, clip=0.5))


def test_F_ENGINE_2_sigkill_then_engine_load_equals_the_uninterrupted_loop(tmp_path):
    """Dropout and input noise come from the global RNG: the resumed loop only matches with the RNG restored."""
    cfg = dict(strategy="single_device", devices=1, bs=4, accum=2, steps=6, noise=True)
    whole = run_job(tmp_path, "whole", ckpt=str(tmp_path / "ck_whole"), **cfg)
    run_job(tmp_path, "run", ckpt=str(tmp_path / "ck"), kill_at=3, expect_kill=True, **cfg)
    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")
    saved = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert saved["global_step"] == 3
    resumed = run_job(tmp_path, "run", ckpt=str(tmp_path / "ck"), resume=True, **cfg)
    assert resumed["start_step"] == 3 and whole["start_step"] == 0  # it continued from the checkpoint
    assert len(resumed["losses"]) == 6
    for k, v in whole["weights"].items():
        assert torch.equal(resumed["weights"][k], v), k
    assert resumed["losses"] == whole["losses"]
    # the RNG states matter: the same resume with the RNG re-seeded after engine.load diverges
    reseeded = run_job(tmp_path, "cut", ckpt=str(tmp_path / "ck2"), resume=True, reseed_after_load=True, **cfg)
    assert reseeded["losses"][:3] == whole["losses"][:3] and reseeded["losses"][3:] != whole["losses"][3:]


SHARDED = {  # name: (strategy, Engine options)
    "ddp": ("ddp", {}),
    "fsdp_sharded": ("fsdp", {"fsdp": "full_shard"}),
    "fsdp_full": ("fsdp", {"fsdp": "full_shard", "fsdp_config": {"state_dict_type": "full"}}),
    "deepspeed_stage_2": ("deepspeed_stage_2", {}),
}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(SHARDED))
def test_F_ENGINE_2_two_processes_sigkill_then_engine_load_equals_the_uninterrupted_loop(case, tmp_path):
    """Every rank SIGKILLs itself after the save of step 2; the restarted loop loads the strategy's own checkpoint
    files (DDP: full files; FSDP: torch.distributed.checkpoint shards or gathered full files; DeepSpeed: engine
    files) and every rank's RNG state, and ends equal to the uninterrupted loop."""
    strategy, options = SHARDED[case]
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    cfg = dict(strategy=strategy, options=options, devices=2, bs=2, accum=2, steps=4, noise=True)
    whole = run_job(tmp_path, "whole", ckpt=str(tmp_path / "ck_whole"), **cfg)
    run_job(tmp_path, "run", ckpt=str(tmp_path / "ck"), kill_at=2, expect_kill=True, **cfg)
    resumed = run_job(tmp_path, "run", ckpt=str(tmp_path / "ck"), resume=True, **cfg)
    assert resumed["start_step"] == 2  # it continued from the checkpoint
    for k, v in whole["weights"].items():
        assert (resumed["weights"][k] - v).abs().max() <= TOL, k
    assert resumed["losses"] == pytest.approx(whole["losses"], abs=TOL)


@pytest.mark.slow
@pytest.mark.distributed
def test_F_ENGINE_1_launch_fn_under_ddp_spawn_returns_rank_zeros_result_equal_to_one_process(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED"):
        monkeypatch.delenv(k, raising=False)
    from taskfit import Engine

    out = Engine(accelerator="cpu", strategy="ddp_spawn", devices=2).launch(engine_job.spawned_train, 3)
    assert out["rank"] == 0 and out["world_size"] == 2
    want = reference(bs=4, accum=1, steps=3)
    for k, v in want["weights"].items():
        assert (out["weights"][k] - v).abs().max() <= TOL, k
