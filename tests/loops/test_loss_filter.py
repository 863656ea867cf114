"""The lazily applied ``logging_nan_inf_filter`` gives the same float32 sums as filtering every step eagerly
(F-LOOP-8), including a read in the middle of an interval and more steps than one stacked chunk."""

import math

import pytest
import torch

from taskfit.loops.loss_filter import NonFiniteLossFilter


def _eager(losses, base=0.0, base_steps=0, reads=()):
    total, n = torch.tensor(base), base_steps
    for i, x in enumerate(losses):
        total = total + torch.where(torch.isfinite(x), x, total / max(1, n))
        n += 1
    return total


@pytest.mark.parametrize("n_steps, bad", [(7, ()), (7, (0,)), (7, (3, 4)), (2500, (5, 1500, 2499)), (3, (0, 1, 2))])
def test_f_loop_8_lazy_filter_equals_eager_filter(n_steps, bad):
    g = torch.Generator().manual_seed(0)
    losses = [torch.rand((), generator=g) * 3 for _ in range(n_steps)]
    for i in bad:
        losses[i] = torch.tensor(math.nan if i % 2 else math.inf)
    f, running = NonFiniteLossFilter(), torch.zeros(())
    for x in losses:
        running += x
        f.add(x)
    out = f.apply(running, n_steps)
    assert out is running  # filtered in place
    assert torch.equal(out, _eager(losses)), (float(out), float(_eager(losses)))
    assert math.isfinite(float(out))


def test_f_loop_8_lazy_filter_read_mid_interval_and_resumed_base():
    """A read (checkpoint) in the middle of an interval, then more steps: the replay starts from the value read;
    a filter reset to a restored base (resume) replays from that base."""
    xs = [torch.tensor(v) for v in (1.0, math.nan, 2.0, math.inf, 0.5)]
    f, running = NonFiniteLossFilter(), torch.zeros(())
    for x in xs[:2]:
        running += x
        f.add(x)
    f.apply(running, 2)
    assert float(running) == 2.0  # 1 + mean(1)
    for x in xs[2:]:
        running += x
        f.add(x)
    f.apply(running, 5)
    assert torch.equal(running, _eager(xs))
    g, restored = NonFiniteLossFilter(), torch.tensor(4.0)
    g.reset(restored, 2)  # resumed: 2 steps summing to 4 before this process
    running = restored.clone()
    for x in (torch.tensor(math.nan), torch.tensor(1.0)):
        running += x
        g.add(x)
    g.apply(running, 4)
    assert float(running) == 4.0 + 2.0 + 1.0


def test_lazy_filter_without_records_does_not_touch_the_sum():
    f, running = NonFiniteLossFilter(), torch.tensor(math.nan)
    assert f.apply(running, 3) is running and math.isnan(float(running))  # filter off: no replay, no sync
