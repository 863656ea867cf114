"""What runs where under ``Engine.launch()`` (F-ENGINE-1): code above ``launch()`` runs in every process of a
``python train.py`` run as one plain process (no rank variables, so Accelerate's ``PartialState`` that
``transformers.TrainingArguments`` builds forms no process group in the worker alone); every rank computes with the
same torch thread count; torchrun starting another number of processes than an explicit ``devices`` warns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from taskfit import Engine, FitArguments
from taskfit.strategies.environments.held import HELD, export_held, hold_back, lookup
from taskfit.strategies.launchers.threads import threads_per_process, usable_cores

HERE = Path(__file__).parent
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TASKFIT_LAUNCHED", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "OMP_NUM_THREADS", HELD)


def _run_two_processes(tmp_path: Path, built_above: str) -> None:
    """The efficiency guide's loop with ``built_above`` built before ``engine.launch()``, DDP on 2 gloo processes, no
    ``OMP_NUM_THREADS`` given: it finishes cleanly (no monitoredBarrier failure at exit); above ``launch()`` neither
    rank had a process group or ``LOCAL_RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` (HF's world size was 1 in both)
    while ``os.environ.get("RANK", "0")`` was each one's rank; after it both have the variables; both compute with
    cores // 2 torch threads; the ranks agree on the weights."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "hf_args_job.py"), str(tmp_path / "job"), built_above],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    took = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "monitoredBarrier" not in proc.stderr and "parallel_mode" not in proc.stderr, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"job.rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert got["above_launch"] == {"group": False, "group_variables": [], "rank": str(r), "hf_world_size": 1}, r
        assert (got["rank"], got["world_size"], got["rank_variable"]) == (r, 2, str(r))
        assert got["threads"] == max(1, usable_cores() // 2), (r, got["threads"])
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key
    print(f"2-process run with {built_above} above launch(): {took:.1f} s")


@pytest.mark.distributed
def test_F_ENGINE_1_accelerate_partial_state_above_launch_forms_no_group_and_ranks_share_threads(tmp_path):
    """Accelerate's ``PartialState`` (what ``transformers.TrainingArguments`` builds) above ``engine.launch()`` of a
    2-process DDP script: no process group in the worker alone, equal thread counts, equal weights."""
    _run_two_processes(tmp_path, "partial_state")


@pytest.mark.slow
@pytest.mark.distributed
def test_F_ENGINE_1_hf_training_arguments_above_launch_ddp_two_processes(tmp_path):
    """The same with ``transformers.TrainingArguments`` itself built above ``launch()`` (the efficiency guide's
    script; slow: each process imports transformers)."""
    _run_two_processes(tmp_path, "training_arguments")


def test_F_ENGINE_1_threads_per_process_shares_the_cores_and_the_users_value_wins():
    assert threads_per_process(2, environ={}, cores=2) == 1
    assert threads_per_process(2, environ={}, cores=16) == 8
    assert threads_per_process(3, environ={}, cores=2) == 1  # never 0
    assert threads_per_process(4, environ={"OMP_NUM_THREADS": "3"}, cores=16) == 3
    assert threads_per_process(2, environ={"OMP_NUM_THREADS": ""}, cores=4) == 2  # empty: unset
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS='two' must be a positive integer"):
        threads_per_process(2, environ={"OMP_NUM_THREADS": "two"})
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS='0'"):
        threads_per_process(2, environ={"OMP_NUM_THREADS": "0"})


def test_F_ENGINE_1_held_rank_variables_reach_the_environment_only_at_launch(monkeypatch):
    """A worker's start environment has no LOCAL_RANK/WORLD_SIZE; the TorchElastic environment reads them held back, and
    ``export_held`` puts them into ``os.environ`` (what the worker's ``launch()`` does)."""
    from taskfit.strategies.environments import TorchElasticEnvironment

    child = hold_back({"PATH": "/bin", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}, {"LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert {"LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}.isdisjoint(child) and child["PATH"] == "/bin"
    _clear_launch_env(monkeypatch)
    for key, value in child.items():
        monkeypatch.setenv(key, value)
    assert TorchElasticEnvironment.detect() and lookup("LOCAL_RANK") == "1" and "LOCAL_RANK" not in os.environ
    env = TorchElasticEnvironment()
    assert (env.global_rank(), env.local_rank(), env.world_size()) == (1, 1, 2)
    args = FitArguments()  # HF's process properties know the rank before the launch too
    assert (args.world_size, args.process_index, args.local_process_index, args.should_save) == (2, 1, 1, False)
    export_held()
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]) == ("1", "1", "2")
    assert HELD not in os.environ


def _clear_launch_env(monkeypatch) -> None:
    """No launcher variables; every one restored after the test, also those the code under test sets itself, and
    the rank-zero gate an Engine sets."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", getattr(rank_zero_only, "rank", 0), raising=False)
    for key in _LAUNCH_VARS:
        monkeypatch.setenv(key, "0")  # recorded, so that the test's own writes are undone too
        monkeypatch.delenv(key)


def _torchrun_env(monkeypatch, world: int, rank: int = 0) -> None:
    _clear_launch_env(monkeypatch)
    for key, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world,
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29511, "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(key, str(value))


def _mismatch_warnings(**kw) -> tuple[Engine, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine = Engine(accelerator="cpu", **kw)
    return engine, [str(w.message) for w in seen if "started" in str(w.message)]


def test_F_ENGINE_1_torchrun_world_size_against_explicit_devices_warns_and_names_the_winner(monkeypatch):
    """The environment torchrun gives rank 0 of 2 processes: ``devices=1`` with DDP warns that torchrun's 2 win
    (and the run has world size 2); with the single-device strategy that the code wins (each process alone);
    ``devices="auto"`` or a matching count say nothing; rank 1 says nothing."""
    _torchrun_env(monkeypatch, world=2)
    engine, said = _mismatch_warnings(strategy="ddp", devices=1)
    assert engine.world_size == 2 and len(said) == 1
    assert "torchrun started 2 process(es)" in said[0] and "devices=1 x num_nodes=1 = 1" in said[0]
    assert "the launcher wins" in said[0] and "world size 2" in said[0]
    engine, said = _mismatch_warnings(strategy="auto", devices=1)
    assert engine.world_size == 1 and len(said) == 1 and "the code wins" in said[0]
    assert _mismatch_warnings(strategy="ddp", devices="auto")[1] == []
    assert _mismatch_warnings(strategy="ddp", devices=2)[1] == []
    _torchrun_env(monkeypatch, world=2, rank=1)
    assert _mismatch_warnings(strategy="ddp", devices=1)[1] == []
