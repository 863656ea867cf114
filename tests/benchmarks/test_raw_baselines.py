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
