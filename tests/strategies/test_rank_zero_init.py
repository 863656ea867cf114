"""F-FT-5: big-model initialisation. Rank 0 builds the real model, every other rank builds it on the meta device
(``rank_zero_init``); FSDP shards first and broadcasts rank 0's weights into the shards, so a non-zero rank never
holds a whole copy; DDP fills uninitialised replicas with its start-up broadcast. Measured with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from taskfit.core.rank_zero_init import rank_zero_init
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))


def _job(tmp_path, name: str, **cfg) -> list[dict]:
    """Run ``rank_zero_init_job.py`` with 2 processes; both ranks' reports."""
    cfg = {"out": str(tmp_path / name), "result": str(tmp_path / name), **cfg}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "rank_zero_init_job.py"), str(path)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=500,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"{name}.rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp_cpu_ram_efficient_loading_peak_memory_F_FT_5(tmp_path):
    """F-FT-5: 2 FSDP processes with ``fsdp_config={"cpu_ram_efficient_loading": True}`` and a 403 MB model
    (96 x 1024 x 1024 fp32, built in ``configure_model``): rank 1 builds it on the meta device and its peak resident
    memory grows by well under one copy (measured: 0.69 of a copy: its half of the shards, one tensor in flight and the run's own ~40 MB of
    set-up), while rank 0, which built the whole model, grows by at least one copy; both hold rank 0's weights exactly, and training then moves them (the optimizer was
    re-pointed at the materialised shards)."""
    rank0, rank1 = _job(tmp_path, "fsdp", strategy="fsdp", layers=96, width=1024, steps=1,
                        options={"fsdp_config": {"cpu_ram_efficient_loading": True}})
    full = rank0["model_bytes"]
    assert full == 96 * 1024 * 1024 * 4 == rank1["model_bytes"]
    assert rank0["built_real"] and not rank1["built_real"]
    assert rank0["peak_added_bytes"] >= full, rank0  # the measurement sees a copy where there is one
    assert rank1["peak_added_bytes"] < 0.8 * full, rank1  # half the shards + one 4 MB tensor + set-up, not a copy
    assert rank0["equal_to_rank0"] and rank1["equal_to_rank0"]
    assert rank0["end_sum"] == rank1["end_sum"] != rank0["start_sum"]


@pytest.mark.distributed
@pytest.mark.slow
def test_ddp_meta_replicas_get_rank0_weights_F_FT_5(tmp_path):
    """F-FT-5: 2 DDP processes, rank 1's model built on the meta device: its replica is allocated uninitialised and
    filled by DDP's broadcast (rank 0's weights exactly), and the optimizer built over the meta parameters trains
    the real ones (the same moved weights on both ranks)."""
    rank0, rank1 = _job(tmp_path, "ddp", strategy="ddp", layers=2, width=64, steps=2)
    assert rank0["built_real"] and not rank1["built_real"]
    assert rank0["equal_to_rank0"] and rank1["equal_to_rank0"]
    assert rank0["end_sum"] == rank1["end_sum"] != rank0["start_sum"]


def test_rank_zero_init_builds_on_meta_off_rank_zero_F_FT_5(monkeypatch):
    """F-FT-5: the block builds real weights on rank 0 (``RANK`` unset or 0) and meta tensors elsewhere, and
    says which; a bad rank is refused, naming it."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    with rank_zero_init() as real:
        layer = nn.Linear(4, 4)
    assert real and not layer.weight.is_meta
    monkeypatch.setenv("RANK", "1")
    with rank_zero_init() as real:
        layer = nn.Linear(4, 4)
    assert not real and layer.weight.is_meta and layer.weight.shape == (4, 4)
    assert torch.empty(1).device.type == "cpu"  # the default device is restored after the block
    with rank_zero_init(rank=0) as real:
        assert real
    with pytest.raises(ValueError, match=r"rank=\.\.\.\) needs a process rank .*got -1"), rank_zero_init(rank=-1):
        pass
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not a process rank"), rank_zero_init():
        pass


def test_engine_rank_zero_init_uses_the_engine_rank_F_FT_5(monkeypatch):
    """F-FT-5: ``Engine.rank_zero_init`` builds by the engine's own rank (0 in one process: real weights), whatever
    ``RANK`` says; a single-process strategy given a meta-device model is refused before any work."""
    from taskfit import Engine
    from taskfit.strategies.rank_zero_weights import loads_from_rank_zero

    monkeypatch.setenv("RANK", "1")
    engine = Engine(accelerator="cpu", devices=1)
    with engine.rank_zero_init() as real:
        layer = nn.Linear(3, 3)
    assert real and not layer.weight.is_meta
    with torch.device("meta"):
        meta = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="Linear has parameters on the meta device, but this run has one process"):
        loads_from_rank_zero(meta, torch.device("cpu"), 0, 1, lambda what, fn: fn())
    assert loads_from_rank_zero(layer, torch.device("cpu"), 0, 1, lambda what, fn: fn()) is False
