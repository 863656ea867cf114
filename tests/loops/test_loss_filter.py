"""The lazily applied ``logging_nan_inf_filter`` gives the same float32 sums as HF's eager per-micro-batch filter
(F-LOOP-8: ``tr_loss / (1 + steps since the last log)`` in place of a non-finite loss), including a read in the
middle of an interval and more losses than one stacked chunk."""

import math

import pytest
import torch

from taskfit.loops.loss_filter import NonFiniteLossFilter


def _eager(losses, steps, base=0.0):
    """HF ``Trainer``: each micro-batch loss, or the running mean when it is not finite."""
    total = torch.tensor(base)
    for x, k in zip(losses, steps):
        total = total + torch.where(torch.isfinite(x), x, total / (1 + k))
    return total


@pytest.mark.parametrize("n, accum, bad", [(7, 1, ()), (7, 1, (0,)), (8, 2, (3, 4)), (2500, 3, (5, 1500, 2499)),
                                           (3, 1, (0, 1, 2))])
def test_f_loop_8_lazy_filter_equals_eager_filter(n, accum, bad):
    g = torch.Generator().manual_seed(0)
    losses = [torch.rand((), generator=g) * 3 for _ in range(n)]
    for i in bad:
        losses[i] = torch.tensor(math.nan if i % 2 else math.inf)
    steps = [i // accum for i in range(n)]  # optimizer steps done when each micro-batch ran
    f, running = NonFiniteLossFilter(), torch.zeros(())
    for x, k in zip(losses, steps):
        running += x
        f.add(x, k)
    out = f.apply(running, n // accum)
    assert out is running  # filtered in place
    assert torch.equal(out, _eager(losses, steps)), (float(out), float(_eager(losses, steps)))
    assert math.isfinite(float(out))


def test_f_loop_8_lazy_filter_read_mid_interval_and_resumed_base():
    """A read (checkpoint) in the middle of an interval, then more steps: the replay starts from the value read;
    a filter reset to a restored base (resume) replays from that base."""
    xs = [torch.tensor(v) for v in (1.0, math.nan, 2.0, math.inf, 0.5)]
    f, running = NonFiniteLossFilter(), torch.zeros(())
    for k, x in enumerate(xs[:2]):
        running += x
        f.add(x, k)
    f.apply(running, 2)
    assert float(running) == 1.5  # 1 + 1 / (1 + 1)
    for k, x in enumerate(xs[2:], start=2):
        running += x
        f.add(x, k)
    f.apply(running, 5)
    assert torch.equal(running, _eager(xs, range(5)))
    g, restored = NonFiniteLossFilter(), torch.tensor(4.0)
    g.reset(restored, 2)  # resumed: 2 steps summing to 4 before this process
    running = restored.clone()
    for k, x in ((2, torch.tensor(math.nan)), (3, torch.tensor(1.0))):
        running += x
        g.add(x, k)
    g.apply(running, 4)
    assert torch.equal(running, _eager([torch.tensor(math.nan), torch.tensor(1.0)], [2, 3], base=4.0))


def test_lazy_filter_without_records_does_not_touch_the_sum():
    f, running = NonFiniteLossFilter(), torch.tensor(math.nan)
    assert f.apply(running, 3) is running and math.isnan(float(running))  # filter off: no replay, no sync


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lazy_filter_keeps_cpu_losses_of_any_dtype_exactly(dtype):
    """A CPU loss is recorded as its value; replayed, it is the same tensor value of its dtype."""
    losses = [torch.tensor(v, dtype=dtype) for v in (0.3, math.nan, 1.7, 2.9)]
    f, running = NonFiniteLossFilter(), torch.zeros(())
    for k, x in enumerate(losses):
        running += x
        f.add(x, k)
    f.apply(running, 4)
    assert torch.equal(running, _eager(losses, range(4)))
