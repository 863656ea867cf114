"""The fit loop's per-step path (F-BENCH-1, F-LOOP-1): what is decided once per run costs nothing per step.

Count-based, not timed: the Python functions a steady-state step of a real run calls are recorded with
``sys.setprofile`` between two batch fetches, and the strategy's plain layers are read from real strategy objects.
"""

import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, Dataset

from helpers.models import Regression
from taskfit import Callback, Fit, FitArguments
from taskfit.accelerators.cpu import CPUAccelerator
from taskfit.precision.precision import DoublePrecision, MixedPrecision, Precision
from taskfit.strategies.single_device import SingleDeviceStrategy
from taskfit.strategies.step_path import PLAIN_STEP_PARTS

START, STOP = 4, 7  # the recorded window: from the fetch of batch START to the fetch of batch STOP (3 steps)
STEPS = STOP - START
#: taskfit functions a default CPU fp32 step calls (fit_loop: _run_window, _after_window, _after_step; the step:
#: start_window, micro_batch, _forward_backward, _step_optimizers; infer_batch_size, ResultCollection.set_batch,
#: GracefulStop.poll; LossSums.add and the NaN filter's add: the running loss added in place on the device, as
#: no CPU loss may be converted or kept per step). A new per-step call fails here: make it once per run, or raise
#: this with the reason.
CALL_BUDGET = 12
#: strategy / precision layers that are no-ops or plain calls on one CPU process in fp32 (skipped per step)
PLAIN_LAYERS = {"forward_context", "no_backward_sync", "batch_to_device", "convert_input", "before_optimizer_step",
                "unscale_gradients", "nullcontext.__init__", "nullcontext.__enter__", "nullcontext.__exit__",
                "Strategy.backward", "Precision.backward", "Strategy.optimizer_step", "Precision.optimizer_step"}
#: C functions that would allocate a tensor or wait for the device, if the step path called them per step (a CPU
#: loss's ``item()``, how the running loss records it, does neither)
ALLOCATING = {"tolist", "zeros", "zeros_like", "ones", "tensor", "as_tensor", "empty", "full", "clone",
              "synchronize"}
#: tensor operations (aten ops) a default CPU fp32 step runs beyond the hand-written loop's: the running loss's
#: ``detach`` and in-place add, and HF's NaN filter's copy into its buffer (``select``, ``copy_``): no ``.item()``
#: and nothing kept per step (DESIGN's hot path; a kept tensor fragments the heap). A new per-step op fails here.
ATEN_BUDGET = 4


class _AtenCount(TorchDispatchMode):
    """Counts the aten ops run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


class _ProfiledBatches(Dataset):
    """Batch ``i`` of a tiny regression set; fetching batch START turns the profiler (or with ``aten``, the aten op
    count) on, batch STOP off."""

    def __init__(self, n: int, record: dict, aten: _AtenCount | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, 4, generator=g), torch.randn(n, 8, generator=g)
        self.record, self.aten = record, aten

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i == START:
            self.aten.__enter__() if self.aten is not None else sys.setprofile(self._profile)
        elif i == STOP:
            self.aten.__exit__(None, None, None) if self.aten is not None else sys.setprofile(None)
        return self.x[i], self.y[i]

    def _profile(self, frame, event, arg) -> None:
        in_taskfit = "taskfit" in frame.f_globals.get("__name__", "")
        if event == "call":
            name = frame.f_code.co_qualname
            self.record.setdefault("py", []).append((frame.f_globals.get("__name__", ""), name))
        elif event == "c_call" and in_taskfit:
            self.record.setdefault("c", []).append(getattr(arg, "__name__", repr(arg)))


class _Linear(Regression):
    """The canonical ``Linear(4, 1)`` (seed 0) with its own plain SGD, which the hand-written loop steps too (the
    training step logs nothing, so the counted path is the bare step)."""

    def __init__(self) -> None:
        super().__init__(features=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _EndOnly(Callback):
    """Overrides no per-step hook: it must cost nothing per step."""

    def on_train_end(self, fit, module) -> None:
        self.ended = True


def _profiled_run(tmp_path, aten: _AtenCount | None = None) -> dict:
    record: dict = {}
    data = DataLoader(_ProfiledBatches(10, record, aten), batch_size=None)
    args = FitArguments(output_dir=str(tmp_path), max_steps=10, max_grad_norm=0.0, logging_strategy="no",
                        save_strategy="no", report_to="none", disable_tqdm=True, seed=0)
    callback = _EndOnly()
    Fit(args, accelerator="cpu", precision="32-true", callbacks=[callback]).fit(_Linear(), data)
    assert callback.ended and (aten is not None or record["py"]), "the run did not reach the recorded steps"
    return record


def _raw_loop_aten_ops() -> int:
    """Aten ops of the hand-written loop (forward, loss, backward, step, zero_grad) over the recorded steps."""
    aten, module = _AtenCount(), _Linear()
    optimizer = module.configure_optimizers()
    for i, batch in enumerate(DataLoader(_ProfiledBatches(10, {}, aten), batch_size=None)):
        module.training_step(batch, i).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return aten.n


def test_steady_state_step_calls_only_the_step_path(tmp_path):
    """F-BENCH-1: a default CPU fp32 step calls no callback that overrides nothing, no no-op strategy or precision
    layer, no allocating or syncing tensor function from taskfit's code, and at most CALL_BUDGET taskfit
    functions."""
    record = _profiled_run(tmp_path)
    calls = record["py"]
    ours = [(mod, name) for mod, name in calls if mod.startswith("taskfit")]
    assert not [c for c in ours if c[0].startswith("taskfit.callbacks") or "_EndOnly" in c[1]], ours
    assert not [c for c in calls if c[1] in PLAIN_LAYERS or c[1].split(".")[-1] in PLAIN_LAYERS], calls
    assert not [c for c in record.get("c", []) if c in ALLOCATING], record.get("c")
    assert len(ours) / STEPS <= CALL_BUDGET, sorted(set(ours))


def test_steady_state_step_adds_at_most_the_budgeted_tensor_ops(tmp_path):
    """F-BENCH-1: a default CPU fp32 step runs at most ATEN_BUDGET tensor ops beyond the hand-written loop's (each
    is a trip through torch's dispatcher, a few microseconds on a small model)."""
    aten = _AtenCount()
    _profiled_run(tmp_path, aten)
    raw = _raw_loop_aten_ops()
    assert raw > 0 and (aten.n - raw) / STEPS <= ATEN_BUDGET, (aten.n, raw)


@pytest.mark.parametrize(("precision", "device", "expected"), [
    (Precision(), "cpu", set(PLAIN_STEP_PARTS)),
    (MixedPrecision("bf16-mixed"), "cpu", {"batch", "sync"}),  # autocast, its own backward and step
    (DoublePrecision(), "cpu", set(PLAIN_STEP_PARTS) - {"batch"}),  # batches are cast to float64
    (Precision(), "cuda", set(PLAIN_STEP_PARTS) - {"batch"}),  # batches move to the device
])
def test_plain_step_parts_follow_device_and_precision(precision, device, expected):
    strategy = SingleDeviceStrategy(CPUAccelerator(), torch.device(device, 0) if device == "cuda" else
                                    torch.device(device), precision)
    assert strategy.plain_step_parts() == frozenset(expected)


def test_an_override_drops_its_plain_part():
    """A subclass's or an instance's own step method is called per step, never skipped."""

    class OwnBackward(SingleDeviceStrategy):
        def backward(self, loss, *args, **kwargs):
            loss.backward()

    strategy = OwnBackward(CPUAccelerator(), torch.device("cpu"), Precision())
    assert strategy.plain_step_parts() == frozenset(PLAIN_STEP_PARTS) - {"backward"}
    strategy.no_backward_sync = lambda enabled=True: None
    assert strategy.plain_step_parts() == frozenset(PLAIN_STEP_PARTS) - {"backward", "sync"}


def test_a_wrapper_set_on_the_class_is_called(monkeypatch):
    """A profiler or a call recorder that wraps a step method on the class after import is not skipped."""
    original = SingleDeviceStrategy.no_backward_sync

    def recorded(self, enabled=True):
        return original(self, enabled)

    monkeypatch.setattr(SingleDeviceStrategy, "no_backward_sync", recorded)
    strategy = SingleDeviceStrategy(CPUAccelerator(), torch.device("cpu"), Precision())
    assert strategy.plain_step_parts() == frozenset(PLAIN_STEP_PARTS) - {"sync"}
