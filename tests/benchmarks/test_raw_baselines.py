"""The strategies suite's raw baselines train the same job as the taskfit rows they are compared with
(F-BENCH-3): two steps on one process, the hand-written loop and ``Fit`` with the matching strategy end with the
same weights (bitwise, fp32 CPU) and the same loss. Keeps the ``taskfit / raw`` ratios honest."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level folder of the checkout, not part of the package

from benchmarks import strategies  # noqa: E402
from benchmarks.fitjobs import mlp_task, synthetic_data  # noqa: E402
from benchmarks.raw_loops import train_raw  # noqa: E402

SIZES, BATCH, STEPS = (12, 16, 16, 3), 4, 2


@pytest.fixture
def world_of_one():
    """A one-process gloo group, as a launcher would give the distributed rows."""
    import torch.distributed as dist

    from taskfit.strategies.environments import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach()


def _compare(row: str, tmp_path) -> None:
    from taskfit import Fit

    _, kind, options = strategies.raw_counterpart(row)
    data = synthetic_data(BATCH * 6, SIZES[0], SIZES[-1])
    raw = train_raw(kind, options, mlp_task(SIZES).net, data, batch=BATCH, steps=STEPS)
    _, strategy, _, extra, _ = next(r for r in strategies.ROWS if r[0] == row)
    args = strategies.fit_arguments(str(tmp_path / row), STEPS, BATCH, strategy, 1, extra, save=False)
    fit = Fit(args)
    fit.fit(mlp_task(SIZES), data)
    got = {k.split("net.", 1)[1]: _full(v) for k, v in fit.model.state_dict().items()}
    want = {k: _full(v) for k, v in raw.state_dict().items()}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), (row, k)
    x, y = data.tensors
    net = mlp_task(SIZES).net
    net.load_state_dict(want)
    loss_raw = F.cross_entropy(net(x), y)
    net.load_state_dict(got)
    assert F.cross_entropy(net(x), y).item() == loss_raw.item()


def test_F_BENCH_3_raw_single_device_loop_equals_taskfit(tmp_path):
    _compare("single_device", tmp_path)


@pytest.mark.parametrize("row", ["ddp", "fsdp_full_shard", "fsdp_no_shard"])
def test_F_BENCH_3_raw_distributed_loops_equal_taskfit_on_one_process(row, tmp_path, world_of_one):
    _compare(row, tmp_path)


def test_F_BENCH_3_every_row_has_a_raw_counterpart_and_the_table_shows_ratios_and_load():
    for row in strategies.ROWS:
        label, kind, options = strategies.raw_counterpart(row[0])
        assert label and kind
    assert strategies.raw_counterpart("fsdp_full_shard_offload")[1:] == (
        "fsdp", {"sharding": "full_shard", "offload": True})
    assert strategies.raw_counterpart("deepspeed_stage_3_offload")[2] == {
        "stage": 3, "offload_optimizer": True, "offload_param": True}
    with pytest.raises(ValueError, match="unknown strategies row 'nope'; valid: single_device, ddp"):
        strategies.raw_counterpart("nope")
    run = {"step_s": 0.02, "samples_per_s": 6400.0, "peak_rss_bytes_per_rank": [2**20, 2**20],
           "checkpoint_bytes": 2**20, "save_s": 0.1, "load_s": 0.05}
    raw = {"step_s": 0.019, "samples_per_s": 6736.8, "peak_rss_bytes_per_rank": [2**20, 2**20], "raw": "DDP loop"}
    row = strategies._combine({"taskfit": [run, {**run, "step_s": 0.022}], "raw": [raw, {**raw, "step_s": 0.02}]})
    assert row["ratio"]["median"] == pytest.approx((0.02 / 0.019 + 0.022 / 0.02) / 2)
    load = {"loadavg": [5.0, 4.0, 3.0], "uptime": "up"}
    md = strategies.markdown({
        "machine": {"versions": {"torch": "2"}, "python": "3", "cpu": "c", "cpu_count": 2, "threads": 1,
                    "date_utc": "now"},
        "settings": {"steps": 20, "warmup": 3, "reps": 2, "batch_per_device": 64, "model": "MLP", "threads": 1},
        "load": {"before": load, "after": load},
        "rows": {"ddp": {"devices": 2, **row},
                 "model_parallel": {"devices": 2, "skipped": "not available (strategy 'model_parallel' is not "
                                                             "registered)"}},
    })
    assert "| ddp | 2 | DDP loop | 21.0 (20.0-22.0) | 19.5 (19.0-20.0) | 1.08x (1.05-1.10, 2 reps) |" in md
    assert "skipped: not available" in md and "before the suite: 5.00, 4.00, 3.00" in md
