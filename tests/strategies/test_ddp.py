"""DistributedDataParallel with real processes on gloo (F-STRAT-2, F-STRAT-7, F-STRAT-8, F-CORE-5, F-CKPT-2):
equivalence with one process on the big batch (token-weighted losses, accumulation), launching by taskfit itself,
by torchrun (one and two nodes) and by spawn, exact resume after SIGKILL, dead workers, cluster environments."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from taskfit import FitArguments
from taskfit.connector import resolve_components
from taskfit.strategies.environments import (
    LocalEnvironment, SLURMEnvironment, TorchElasticEnvironment, detect_environment, find_free_port,
)
from taskfit.strategies.environments.slurm import first_host

pytestmark = pytest.mark.distributed
HERE = Path(__file__).parent
JOB = HERE / "ddp_job.py"
sys.path.insert(0, str(HERE.parent / "checkpoint"))
import job as ckpt_job  # noqa: E402

TOL = 1e-6  # fp32: the same sums in a different order


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED", "SLURM_NTASKS")}
    return {**env, "OMP_NUM_THREADS": "1"}


def run(tmp_path: Path, cfg: dict, name: str, launcher: list[str] | None = None, check: bool = True,
        env: dict | None = None) -> subprocess.CompletedProcess:
    cfg = {"out": str(tmp_path / name), "result": str(tmp_path / f"{name}.pt"), **cfg}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([*(launcher or [sys.executable]), str(JOB), str(path)], capture_output=True, text=True,
                          timeout=240, env={**_env(), **(env or {})}, cwd=tmp_path)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def result(tmp_path: Path, name: str, rank: int = 0) -> dict:
    return torch.load(tmp_path / f"{name}.rank{rank}.pt", weights_only=False)


def assert_close(a: dict, b: dict, tol: float = TOL) -> None:
    for k, v in a.items():
        assert torch.allclose(v, b[k], atol=tol, rtol=0), (k, (v - b[k]).abs().max())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process on the big batch (8 = 2 ranks x 4), with and without accumulation."""
    tmp = tmp_path_factory.mktemp("single")
    run(tmp, {"bs": 8, "eval": True, "eval_bs": 1}, "plain")
    run(tmp, {"bs": 8, "accum": 2}, "accum")
    return {"plain": result(tmp, "plain"), "accum": result(tmp, "accum")}


def test_F_STRAT_2_ddp_launched_by_taskfit_equals_single_process(tmp_path, single):
    """``python job.py`` with ``Fit(strategy="ddp", devices=2)`` re-launches itself; token-count weighting across
    ranks makes 2 x 4 equal to one batch of 8 although ranks hold different numbers of tokens. Rank 1 builds
    its model from another seed: DDP starts every rank from rank 0's weights."""
    run(tmp_path, {"bs": 4, "strategy": "ddp", "devices": 2, "eval": True, "rank_seed": 1, "eval_bs": 1}, "ddp")
    r0, r1, ref = result(tmp_path, "ddp", 0), result(tmp_path, "ddp", 1), single["plain"]
    assert (r0["world_size"], r1["rank"]) == (2, 1)
    assert not torch.equal(r0["initial"]["net.0.weight"], r1["initial"]["net.0.weight"])
    assert_close(ref["weights"], r0["weights"])
    assert all(torch.equal(v, r1["weights"][k]) for k, v in r0["weights"].items())  # replicas stay identical
    assert [row["loss"] for row in r0["log"] if "loss" in row] == pytest.approx(
        [row["loss"] for row in ref["log"] if "loss" in row], abs=1e-5)
    # evaluation: predictions gathered in dataset order without the sampler's padding repeat (17 samples)
    assert r0["predictions"].shape == (17, 6) and np.array_equal(r0["predictions"], ref["predictions"])
    assert np.array_equal(r1["predictions"], ref["predictions"])
    # eval loss and synced logged means leave out the sampler's repeat of sample 0 (17 samples over 2 ranks)
    assert r0["eval"]["eval_loss"] == pytest.approx(ref["eval"]["eval_loss"], abs=1e-6)
    assert r0["eval"]["val_ce"] == pytest.approx(ref["eval"]["val_ce"], abs=1e-6)


def test_F_STRAT_2_ddp_with_accumulation_under_torchrun(tmp_path, single):
    run(tmp_path, {"bs": 4, "accum": 2, "strategy": "ddp", "devices": 2, "order": str(tmp_path / "order.txt"),
                   "args": {"log_level": "info", "log_level_replica": "error", "log_on_each_node": False}}, "torchrun",
        launcher=[sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                  str(find_free_port())])
    assert_close(single["accum"]["weights"], result(tmp_path, "torchrun")["weights"])
    # F-STRAT-8: main_process_first (rank 0's block ends before rank 1's starts); log_level / log_level_replica
    assert (tmp_path / "order.txt").read_text().split("\n")[:2] == ["start 0", "end 0"]
    assert result(tmp_path, "torchrun", 0)["log_level"] == 20 and result(tmp_path, "torchrun", 1)["log_level"] == 40
    assert single["accum"]["loss"] == pytest.approx(result(tmp_path, "torchrun")["loss"], abs=1e-6)


def test_F_LOOP_2_ddp_sample_counts_accumulate_exactly_without_a_count_all_reduce(tmp_path, monkeypatch):
    """Per-sample losses (the item count is the batch size) with accumulation 2 over 18 samples: windows [4, 4]
    and a last [1] per rank equal one process's [8, 8] and [2]. The even split of the distributed sampler gives
    every rank the same counts, so no per-step all-reduce of counts runs; without clipping the logged gradient
    norm (computed only for the log rows) equals the single process's."""
    args = {"max_grad_norm": 0.0}
    run(tmp_path, {"bs": 8, "accum": 2, "samples": 18, "args": args}, "one")
    run(tmp_path, {"bs": 4, "accum": 2, "samples": 18, "strategy": "ddp", "devices": 2, "args": args}, "two")
    one, two = result(tmp_path, "one"), result(tmp_path, "two")
    assert_close(one["weights"], two["weights"])
    logs_one = [r for r in one["log"] if "loss" in r]
    logs_two = [r for r in two["log"] if "loss" in r]
    assert [r["step"] for r in logs_two] == [2, 4, 6]
    # two per log row (the loss mean, the finiteness check), none per optimizer step
    # three logging steps, then the end of fit's own finite check
    assert two["reduces"] == ["_global_tr_loss", "check_finite"] * 3 + ["check_finite"], two["reduces"]
    for a, b in zip(logs_one, logs_two):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5) and a["grad_norm"] > 0


@pytest.mark.slow  # two torchrun agents rendezvous over TCP: slow and timing-sensitive on a loaded 2-core machine
def test_F_STRAT_7_two_torchrun_nodes_equal_one_node_with_two_processes(tmp_path):
    port = find_free_port()
    cfg = {"bs": 4, "strategy": "ddp", "devices": 1, "out": str(tmp_path / "nodes")}
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({**cfg, "result": str(tmp_path / "nodes.pt")}))
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={n}",
                               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(JOB),
                               str(path)], env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for n in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    run(tmp_path, {"bs": 4, "strategy": "ddp", "devices": 2}, "one_node")
    two_nodes, one_node = result(tmp_path, "nodes", 0), result(tmp_path, "one_node", 0)
    assert two_nodes["world_size"] == 2 and result(tmp_path, "nodes", 1)["rank"] == 1
    for k, v in one_node["weights"].items():
        assert torch.equal(v, two_nodes["weights"][k]), k


@pytest.mark.deepspeed
def test_F_STRAT_7_ddp_under_the_deepspeed_launcher(tmp_path, single):
    """The ``deepspeed`` launcher exports the ``env://`` variables (and passes ``--local_rank``): taskfit uses the
    processes it started."""
    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed (pip install 'taskfit[deepspeed]')")
    run(tmp_path, {"bs": 4, "strategy": "ddp", "devices": 2}, "dslaunch",
        launcher=[launcher, "--num_gpus", "2", "--master_port", str(find_free_port())],
        env={"TASKFIT_DEEPSPEED_SHM_COMM": "0", "PATH": os.path.dirname(sys.executable) + os.pathsep +
             os.environ.get("PATH", "")})
    got = result(tmp_path, "dslaunch", 0)
    assert got["world_size"] == 2 and result(tmp_path, "dslaunch", 1)["rank"] == 1
    assert_close(single["plain"]["weights"], got["weights"])


def test_F_STRAT_2_ddp_spawn_returns_trained_weights_to_the_caller(tmp_path, single):
    """ddp_spawn runs fit, then validate and predict (each in freshly spawned workers that start from the caller's
    trained weights) and finishes well within the bound; a stage that tried to join the process group in the
    calling process would wait for ddp_timeout (600 s)."""
    start = time.monotonic()
    run(tmp_path, {"bs": 4, "strategy": "ddp_spawn", "devices": 2, "eval": True, "eval_bs": 1, "timeout": 600},
        "spawn")
    assert time.monotonic() - start < 200
    got = result(tmp_path, "spawn", 0)  # written by the calling process after the workers finished
    assert got["world_size"] == 2 and got["rank"] == 0
    assert_close(single["plain"]["weights"], got["weights"])
    assert [r["loss"] for r in got["log"] if "loss" in r] == pytest.approx(
        [r["loss"] for r in single["plain"]["log"] if "loss" in r], abs=1e-5)
    assert got["eval"]["eval_loss"] == pytest.approx(single["plain"]["eval"]["eval_loss"], abs=1e-6)
    assert np.array_equal(got["predictions"], single["plain"]["predictions"])


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_F_CORE_3_fit_twice_on_one_fit_equals_a_fresh_run(tmp_path, single, strategy):
    """The second fit() on the same Fit (fresh model) under DDP is a run of its own: it equals one process on the
    big batch, as a fresh Fit does (spawn: the workers get private copies, never shared tensors)."""
    run(tmp_path, {"bs": 4, "strategy": strategy, "devices": 2, "twice": True}, "twice")
    got, ref = result(tmp_path, "twice", 0), single["plain"]
    assert_close(ref["weights"], got["weights"])
    assert [r["loss"] for r in got["log"] if "loss" in r] == pytest.approx(
        [r["loss"] for r in ref["log"] if "loss" in r], abs=1e-5)
    assert got["loss"] == pytest.approx(ref["loss"], abs=1e-6)


def test_F_STRAT_2_ddp_spawn_validate_test_predict_on_their_own(tmp_path):
    """validate/test/predict under ddp_spawn without a fit before them finish within the bound and equal one
    process."""
    run(tmp_path, {"bs": 4, "eval_only": True, "eval_bs": 1}, "one")
    start = time.monotonic()
    run(tmp_path, {"bs": 4, "strategy": "ddp_spawn", "devices": 2, "eval_only": True, "eval_bs": 1, "timeout": 600},
        "spawned")
    assert time.monotonic() - start < 150
    one, got = result(tmp_path, "one"), result(tmp_path, "spawned")
    assert got["world_size"] == 2
    assert got["eval"]["eval_loss"] == pytest.approx(one["eval"]["eval_loss"], abs=1e-6)
    assert got["test"]["test_loss"] == pytest.approx(one["test"]["test_loss"], abs=1e-6)
    assert np.array_equal(got["predictions"], one["predictions"])


def test_F_STRAT_7_dead_worker_stops_the_others_with_a_clear_error(tmp_path):
    start = time.monotonic()
    proc = run(tmp_path, {"bs": 4, "strategy": "ddp", "devices": 2, "die": [1, 2], "timeout": 20}, "dead", check=False)
    assert proc.returncode != 0 and time.monotonic() - start < 120
    assert "another process stopped or did not answer within ddp_timeout=20" in proc.stderr
    assert "DistributedError" in proc.stderr


@pytest.mark.parametrize("save_steps", [4, pytest.param(3, marks=pytest.mark.slow)])  # 3: `make test-slow`
def test_F_CKPT_2_ddp_sigkill_then_resume_equals_uninterrupted(tmp_path, save_steps):
    """save_steps=3 with logging every 2 steps: the checkpoint holds a running loss sum that has not been logged
    yet, and each rank's own sum must come back for the next logged loss and train_loss to match."""
    ddp = {"args": {"strategy": "ddp", "devices": 2}, "save_steps": save_steps}
    ref = ckpt_job.run_job({**ddp, "output_dir": str(tmp_path / "ref"), "resume": None}, tmp_path, "ref")
    out = str(tmp_path / "out")
    ckpt_job.run_job({**ddp, "kill_after_step": 10, "output_dir": out}, tmp_path, "killed", expect_kill=True)
    time.sleep(1)  # the other rank notices the dead peer and exits
    saved = tmp_path / "out" / f"checkpoint-{10 // save_steps * save_steps}"
    manifest = json.loads((saved / "manifest.json").read_text())
    assert {"rng_state_0.pt", "rng_state_1.pt"} <= set(manifest["files"]) and manifest["world_size"] == 2
    resumed = ckpt_job.run_job({**ddp, "output_dir": out}, tmp_path, "resumed")
    ckpt_job.assert_same_run(ref, resumed)


# ---- selection, environments, errors (no processes) -------------------------------------------------------
def test_F_STRAT_7_environment_detection(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    env = detect_environment(2)
    assert isinstance(env, LocalEnvironment) and not env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank()) == (2, 0, 0)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    env = detect_environment(2)
    assert isinstance(env, SLURMEnvironment) and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 3, 1, 1)
    assert (env.main_address, env.main_port) == ("gpu07", 10456)
    strategy = resolve_components(FitArguments(strategy="ddp", devices=2))
    assert (strategy.world_size, strategy.global_rank, strategy.launcher) == (4, 3, None)  # srun started them
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: taskfit launches itself
    assert isinstance(detect_environment(2), LocalEnvironment)
    for k, v in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
                 "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(k, v)
    env = detect_environment(2)
    assert isinstance(env, TorchElasticEnvironment) and env.name == "torchrun"
    assert (env.global_rank(), env.main_address, env.main_port) == (1, "10.0.0.1", 1234)
    assert [first_host(s) for s in ("node[03-05,9],gpu1", "a1,a2", "solo")] == ["node03", "a1", "solo"]


def test_F_STRAT_2_ddp_options_reach_distributed_data_parallel():
    s = resolve_components(FitArguments(strategy="ddp", devices=2, ddp_find_unused_parameters=True,
                                        ddp_bucket_cap_mb=5, ddp_broadcast_buffers=False, ddp_backend="gloo"))
    assert s.ddp_kwargs() == {"find_unused_parameters": True, "static_graph": False, "broadcast_buffers": False,
                              "bucket_cap_mb": 5}
    assert s.backend == "gloo" and s.launcher is not None and s.launcher.num_processes == 2


def test_F_STRAT_2_connector_resolves_typed_settings_once_per_run():
    """F-STRAT-2: strategies read typed settings the connector resolved (no options object inside a strategy); a
    run's new options (a trial, a retry) reach the strategy through ``configure_strategy``; settings of another
    family are refused."""
    from taskfit.connector import configure_strategy
    from taskfit.strategies.settings import DDPSettings, StrategySettings

    s = resolve_components(FitArguments(strategy="ddp", devices=2, ddp_timeout=60))
    assert s.settings == DDPSettings(backend=None, timeout=60, find_unused_parameters=False)
    assert s.launcher.join_timeout == 65.0 and not hasattr(s, "args")
    configure_strategy(s, FitArguments(strategy="ddp", devices=2, ddp_timeout=120, ddp_static_graph=True,
                                       ddp_backend="gloo"))
    assert (s.settings.timeout_s, s.launcher.join_timeout, s.backend) == (120.0, 125.0, "gloo")
    assert s.ddp_kwargs()["static_graph"] is True
    with pytest.raises(TypeError, match=r"strategy='ddp' takes DDPSettings; got StrategySettings"):
        s.apply_settings(StrategySettings())
    single = resolve_components(FitArguments())
    assert single.settings == StrategySettings() and single.data_parallel_size == single.world_size == 1
    assert single.check_collective("x", lambda: 7) == 7 and single.device_mesh is None


def test_F_STRAT_2_dp_needs_several_cuda_devices():
    with pytest.raises(ValueError, match=r"strategy='dp'.*needs several CUDA devices.*got 1 cpu device.*'ddp'"):
        resolve_components(FitArguments(strategy="dp"))
