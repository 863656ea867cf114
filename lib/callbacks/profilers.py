"""Profilers (mirror Lightning's ``SimpleProfiler``, ``AdvancedProfiler`` and ``PyTorchProfiler``). Each is a
callback timing actions between hook pairs, so a run without one pays nothing: ``FitArguments(profiler="simple")``
adds one, or pass the object in ``callbacks``. Actions: ``training_batch`` (a whole micro-batch), ``training_step``
(forward), ``backward``, ``optimizer_step`` (clipping, step, scheduler), ``validation_step``, ``test_step``,
``predict_step``."""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from typing import Any, Iterator

from taskfit.callbacks.base import Callback

_EVAL = ("validation", "test", "predict")


class Profiler(Callback):
    """Base: ``start(action)``/``stop(action)`` around the actions; ``summary()`` after fit, also written to
    ``dirpath/filename-{stage}.txt`` when ``filename`` is set (``dirpath`` defaults to ``output_dir``).

    Args:
        dirpath (str | None), filename (str | None): where the summary goes (None: only logged).
    """

    def __init__(self, dirpath: str | None = None, filename: str | None = None) -> None:
        self.dirpath, self.filename = dirpath, filename
        self._open: dict[str, float] = {}

    def start(self, action: str) -> None:
        self._open[action] = time.perf_counter()

    def stop(self, action: str) -> None:
        t0 = self._open.pop(action, None)
        if t0 is not None:
            self.record(action, time.perf_counter() - t0)

    def record(self, action: str, seconds: float) -> None: ...

    @contextlib.contextmanager
    def profile(self, action: str) -> Iterator[None]:
        """Time the ``with`` block as ``action`` (Lightning's ``Profiler.profile``)."""
        self.start(action)
        try:
            yield
        finally:
            self.stop(action)

    def summary(self) -> str:
        return ""

    # the hook pairs ------------------------------------------------------------------------------------------
    def on_train_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.start("training_batch")
        self.start("training_step")

    def on_before_backward(self, fit: Any, module: Any, loss: Any) -> None:
        self.stop("training_step")
        self.start("backward")

    def on_after_backward(self, fit: Any, module: Any) -> None:
        self.stop("backward")

    def on_before_optimizer_step(self, fit: Any, module: Any, optimizer: Any) -> None:
        if "optimizer_step" not in self._open:
            self.start("optimizer_step")

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.stop("optimizer_step")
        self.stop("training_batch")

    def on_validation_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.start("validation_step")

    def on_validation_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.stop("validation_step")

    def on_test_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.start("test_step")

    def on_test_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.stop("test_step")

    def on_predict_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.start("predict_step")

    def on_predict_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.stop("predict_step")

    def on_fit_end(self, fit: Any, module: Any) -> None:
        self.describe(fit, "fit")

    def describe(self, fit: Any, stage: str) -> None:
        """Log the summary and, with ``filename``, write it (main process)."""
        import logging

        text = self.summary()
        if not text or not fit.is_global_zero:
            return
        logging.getLogger("taskfit").info("%s", text)
        if self.filename:
            folder = self.dirpath or fit.args.output_dir
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{self.filename}-{stage}.txt"), "w") as f:
                f.write(text)


class PassThroughProfiler(Profiler):
    """Records nothing: ``trainer.profiler`` of a run without a profiler (Lightning's ``PassThroughProfiler``)."""

    def start(self, action: str) -> None: ...
    def stop(self, action: str) -> None: ...


class SimpleProfiler(Profiler):
    """Count, total and mean seconds per action (Lightning's ``SimpleProfiler``).

    Attributes:
        recorded_durations (dict[str, list[float]]): every duration per action (seconds).
    """

    def __init__(self, dirpath: str | None = None, filename: str | None = None) -> None:
        super().__init__(dirpath, filename)
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)

    def record(self, action: str, seconds: float) -> None:
        self.recorded_durations[action].append(seconds)

    def summary(self) -> str:
        rows = sorted(((a, len(d), sum(d)) for a, d in self.recorded_durations.items()), key=lambda r: -r[2])
        if not rows:
            return ""
        lines = [f"{'Action':<20} | {'Calls':>7} | {'Total (s)':>10} | {'Mean (s)':>10}"]
        lines += [f"{a:<20} | {n:>7} | {t:>10.5f} | {t / n:>10.6f}" for a, n, t in rows]
        return "Profiler report\n" + "\n".join(lines)


class AdvancedProfiler(Profiler):
    """cProfile statistics per action (Lightning's ``AdvancedProfiler``).

    Args:
        line_count_restriction (float): how many functions each action's table lists (``pstats`` restriction).
    """

    def __init__(self, dirpath: str | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0) -> None:
        super().__init__(dirpath, filename)
        self.line_count_restriction = line_count_restriction
        self.profiled_actions: dict[str, Any] = {}

    def start(self, action: str) -> None:
        import cProfile

        if action == "training_batch":
            return  # its parts are profiled; one profiler may run at a time
        prof = self.profiled_actions.setdefault(action, cProfile.Profile())
        try:
            prof.enable()
        except ValueError:  # another action's profiler is active
            return
        self._open[action] = 0.0

    def stop(self, action: str) -> None:
        if self._open.pop(action, None) is not None:
            self.profiled_actions[action].disable()

    def summary(self) -> str:
        import io
        import pstats

        out = []
        for action, prof in self.profiled_actions.items():
            s = io.StringIO()
            pstats.Stats(prof, stream=s).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction)
            out.append(f"Profile stats for: {action}\n{s.getvalue()}")
        return "\n".join(out)


class PyTorchProfiler(Profiler):
    """A ``torch.profiler`` trace of training steps ``skip_first`` .. ``skip_first + active`` written as a Chrome
    trace (``{dirpath}/{filename or 'trace'}.pt.trace.json``; ``dirpath`` defaults to ``output_dir``), plus the
    operator table as the summary (Lightning's ``PyTorchProfiler``).

    Args:
        skip_first (int): optimizer steps before the window; active (int): steps traced.
        record_shapes (bool), profile_memory (bool): passed to ``torch.profiler.profile``.

    Attributes:
        trace_path (str | None): the written trace.
    """

    def __init__(self, dirpath: str | None = None, filename: str | None = None, skip_first: int = 1,
                 active: int = 3, record_shapes: bool = False, profile_memory: bool = False) -> None:
        super().__init__(dirpath, filename)
        self.skip_first, self.active = skip_first, active
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self._prof: Any = None
        self.trace_path: str | None = None
        self._table = ""

    def on_train_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if self._prof is None and self.trace_path is None and step >= self.skip_first:
            import torch

            acts = [torch.profiler.ProfilerActivity.CPU]
            if fit.strategy.accelerator.name == "cuda":  # the run's accelerator, not what the machine has
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=acts, record_shapes=self.record_shapes,
                                                profile_memory=self.profile_memory)
            self._prof.__enter__()
            self._stop_at = step + self.active

    def on_before_backward(self, fit: Any, module: Any, loss: Any) -> None: ...
    def on_after_backward(self, fit: Any, module: Any) -> None: ...
    def on_before_optimizer_step(self, fit: Any, module: Any, optimizer: Any) -> None: ...

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._prof is not None and fit.state.global_step >= self._stop_at:
            self._finish(fit)

    def on_train_end(self, fit: Any, module: Any) -> None:
        if self._prof is not None:
            self._finish(fit)

    def _finish(self, fit: Any) -> None:
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self._table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        if fit.is_global_zero:
            folder = self.dirpath or fit.args.output_dir
            os.makedirs(folder, exist_ok=True)
            self.trace_path = os.path.join(folder, f"{self.filename or 'trace'}.pt.trace.json")
            prof.export_chrome_trace(self.trace_path)

    def summary(self) -> str:
        return self._table


PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}


def profiler_from_args(args: Any) -> Profiler | None:
    """The profiler ``FitArguments.profiler`` names (None when off).

    Raises:
        ValueError: an unknown name (lists the valid ones).
    """
    name = getattr(args, "profiler", None)
    if not name:
        return None
    if name not in PROFILERS:
        raise ValueError(f"profiler={name!r} is not valid; choose one of {sorted(PROFILERS)} or None.")
    return PROFILERS[name](filename="fit-profile" if name != "pytorch" else None)
