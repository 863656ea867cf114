"""The step plan and the window weights of the fit loop (F-LOOP-1, F-LOOP-2): real tensors, asserted values."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from helpers.models import LightningStyle
from taskfit import Fit, FitArguments
from taskfit.loops.fit_loop import plan_steps, resolve_interval
from taskfit.loops.optimization import window_weights


class _Args:
    def __init__(self, accum=1, epochs=1.0, max_steps=-1):
        self.gradient_accumulation_steps, self.num_train_epochs, self.max_steps = accum, epochs, max_steps


def _loader(n_batches, batch_size=4):
    return DataLoader(TensorDataset(torch.arange(n_batches * batch_size, dtype=torch.float32)), batch_size=batch_size)


# ---- the step plan -------------------------------------------------------------------------------------------
def test_plan_counts_the_last_short_window_as_a_step():
    """F-LOOP-2: 10 micro-batches with accumulation 4 are windows of 4, 4, 2: three steps per epoch."""
    assert plan_steps(_loader(10), _Args(accum=4, epochs=2)) == (3, 6, 2)


def test_plan_max_steps_wins_and_fixes_the_epochs():
    assert plan_steps(_loader(10), _Args(accum=4, epochs=9, max_steps=5)) == (3, 5, 2)
    assert plan_steps(_loader(10), _Args(accum=1, epochs=1, max_steps=25)) == (10, 25, 3)


def test_plan_fractional_epochs_round_the_steps_up():
    """HF: ``ceil(num_train_epochs * steps_per_epoch)``."""
    assert plan_steps(_loader(10), _Args(accum=4, epochs=1.5)) == (3, 5, 2)


def test_plan_with_an_accumulation_schedule_counts_each_epoch():
    """Lightning's GradientAccumulationScheduler: 2 micro-batches per step in epoch 0, 5 afterwards."""
    def schedule(epoch):
        return 2 if epoch == 0 else 5

    assert plan_steps(_loader(10), _Args(epochs=3), schedule) == (5, 5 + 2 + 2, 3)
    # max_steps falls in the second epoch
    assert plan_steps(_loader(10), _Args(epochs=3, max_steps=6), schedule) == (5, 6, 2)


def test_plan_refuses_empty_and_endless_data():
    with pytest.raises(ValueError, match="yields no batches"):
        plan_steps(DataLoader(TensorDataset(torch.zeros(3)), batch_size=4, drop_last=True), _Args())

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="set max_steps"):
        plan_steps(DataLoader(Stream()), _Args())
    assert plan_steps(DataLoader(Stream()), _Args(max_steps=7)) == (None, 7, 2**63 - 1)


def test_intervals_below_one_are_ratios_of_max_steps():
    assert resolve_interval(0.25, 10) == 3
    assert resolve_interval(4, 10) == 4
    assert resolve_interval(None, 10) == 10


# ---- the window weights --------------------------------------------------------------------------------------
def test_weights_are_item_counts_over_the_window_total():
    assert window_weights([8, 8, 4]) == [0.4, 0.4, 0.2]
    assert window_weights([5]) == [1.0]
    assert window_weights([0, 0]) == [0.0, 0.0]  # an empty window does not divide by zero


def test_uncountable_micro_batches_weigh_the_same():
    assert window_weights([8, None, 4]) == [pytest.approx(1 / 3)] * 3


def test_token_counts_stay_tensors():
    """Counts of non-ignored tokens are 0-dim tensors: the weights stay tensors (no host sync)."""
    weights = window_weights([torch.tensor(30), torch.tensor(10)])
    assert all(isinstance(w, torch.Tensor) for w in weights)
    assert [w.item() for w in weights] == [0.75, 0.25]


def test_weights_across_processes():
    """Two processes: evenly split batch sizes need no all-reduce; other counts are summed over the processes
    (this rank holds 3 + 1 items, the other rank 6: DDP's average over 2 ranks then gives c / 10 per item)."""
    assert window_weights([3, 1], world=2, even_counts=True) == [0.75, 0.25]
    weights = window_weights([3, 1], world=2, reduce=lambda t, op: t + 6, device=torch.device("cpu"))
    assert [w.item() for w in weights] == pytest.approx([0.6, 0.2])


def test_weighted_window_equals_the_large_batch():
    """F-LOOP-2: the sum of the weighted micro-batch mean losses of a window of 8, 8, 3 samples has the gradient
    of the mean loss over the 19 samples as one batch."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(19, 6, generator=g), torch.randint(0, 3, (19,), generator=g)
    net = torch.nn.Linear(6, 3)
    F.cross_entropy(net(x), y).backward()
    large = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    parts = [(x[:8], y[:8]), (x[8:16], y[8:16]), (x[16:], y[16:])]
    for (xb, yb), w in zip(parts, window_weights([len(yb) for _, yb in parts])):
        (F.cross_entropy(net(xb), yb) * w).backward()
    for p, ref in zip(net.parameters(), large):
        torch.testing.assert_close(p.grad, ref, rtol=1e-6, atol=1e-7)


# ---- the loop's windows, end to end --------------------------------------------------------------------------
class _Recorder(LightningStyle):
    """The canonical ``Linear(1, 1)`` at ``lr=0`` (the weights stay put), recording the weight of every micro-batch
    loss the loop backpropagates (loss / unweighted loss)."""

    def __init__(self):
        super().__init__(features=1, lr=0.0)
        self.seen = []

    def on_before_backward(self, loss):
        self.seen.append(loss.detach())


def test_fit_windows_and_last_short_window(tmp_path):
    """36 samples in batches of 8 (8, 8, 8, 8, 4) with accumulation 2: windows (8, 8), (8, 8), (4); the first two
    weigh their micro-batches 1/2 each, the last window's single micro-batch weighs 1; 3 steps, 36 samples."""
    module = _Recorder()
    x = torch.arange(36, dtype=torch.float32).unsqueeze(-1) / 36
    ds = TensorDataset(x, torch.zeros_like(x))  # a zero target: each loss is the mean of the squared output
    fit = Fit(args=FitArguments(output_dir=str(tmp_path), disable_tqdm=True, report_to="none",
                                   save_strategy="no", num_train_epochs=1, gradient_accumulation_steps=2,
                                   per_device_train_batch_size=8, logging_steps=1000, seed=0),
              )
    fit.fit(module, train_data=DataLoader(ds, batch_size=8))
    assert fit.state.global_step == 3
    assert fit.state.samples_seen == 36
    w = module.layer.weight.detach().item()
    b = module.layer.bias.detach()
    expected = []
    for i, weight in zip(range(5), (0.5, 0.5, 0.5, 0.5, 1.0)):
        x = ds.tensors[0][i * 8:(i + 1) * 8]
        expected.append((x * w + b).pow(2).mean() * weight)
    torch.testing.assert_close(torch.stack(module.seen), torch.stack(expected))


# ---- when gradients are freed --------------------------------------------------------------------------------
class _GradWatcher(LightningStyle):
    """The canonical ``Linear(2, 1)`` with ``SGD(lr=0.1)``, recording per step whether gradients exist in
    ``training_step`` (the previous step's) and in ``on_train_batch_end`` (this step's)."""

    def __init__(self):
        super().__init__(features=2, lr=0.1)
        self.in_forward, self.at_batch_end = [], []

    def training_step(self, batch, batch_idx):
        self.in_forward.append(self.layer.weight.grad is not None)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.at_batch_end.append(self.layer.weight.grad is not None)


class _ZeroGradHook(_GradWatcher):
    def on_before_zero_grad(self, optimizer):
        pass


@pytest.mark.parametrize("module_cls, freed", [(_GradWatcher, True), (_ZeroGradHook, False)])
def test_gradients_freed_after_the_step_unless_a_zero_grad_hook_observes_it(tmp_path, module_cls, freed):
    """HF's order (zero_grad after the step: the old gradients are gone before the next forward) unless the module
    overrides ``on_before_zero_grad`` (Lightning's order: training_step, zero_grad, backward); either way
    ``on_train_batch_end`` sees the step's gradients and the weights are the same."""
    module = module_cls()
    x = torch.randn(12, 2, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(x, x.sum(-1)), batch_size=4)
    Fit(args=FitArguments(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
                          logging_strategy="no", max_grad_norm=0.0, num_train_epochs=1, seed=0)).fit(module, data)
    assert module.at_batch_end == [True, True, True]
    assert module.in_forward == [False, not freed, not freed]
    torch.manual_seed(0)  # the canonical module's initialisation (seed 0)
    ref = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for xb, yb in data:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(ref(xb).view_as(yb), yb).backward()
        opt.step()
    assert torch.equal(module.layer.weight.detach(), ref.weight.detach())
