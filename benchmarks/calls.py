"""Python work per optimizer step, a load-independent proxy of the per-step overhead (F-BENCH-1).

    python -m benchmarks.calls [--runner taskfit|engine] [--workload tiny_mlp] [--steps 200]

Counts, for the overhead suite's workload, the Python function calls, the calls into C functions, the Python
bytecode instructions and the tensor operations (aten ops, each a trip through torch's dispatcher) executed per
optimizer step by a runner and by the hand-written loop, and prints both and the difference (the framework's own
work per step). The counts come from ``sys.setprofile`` / ``sys.settrace`` / a ``TorchDispatchMode`` and do not
depend on the machine's load, so they can be compared between runs on a busy machine
where step times cannot; they do not count time spent inside torch's C++ code. Per step = (count of a run of
``steps + 50`` steps - count of a run of 50 steps) / ``steps``, so set-up and tear-down cancel out.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

SHORT = 50


def _count(runner: str, workload: str, steps: int, opcodes: bool) -> tuple[int, int, int]:
    """``(python calls, C calls, bytecodes)`` of one run of ``steps`` steps (bytecodes 0 unless ``opcodes``)."""
    from benchmarks import runners
    from benchmarks.workloads import build_job

    n = [0, 0, 0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            n[0] += 1
        elif event == "c_call":
            n[1] += 1

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            n[2] += 1
        return local

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    job = build_job(workload, steps)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        sys.settrace(trace) if opcodes else sys.setprofile(profile)
        try:
            runners.RUN[runner](job, tmp)
        finally:
            sys.settrace(None) if opcodes else sys.setprofile(None)
    return n[0], n[1], n[2]


def _count_aten(runner: str, workload: str, steps: int) -> int:
    """Tensor operations (aten ops below autograd, as a ``TorchDispatchMode`` sees them) of one run of ``steps``
    steps."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks import runners
    from benchmarks.workloads import build_job

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    job = build_job(workload, steps)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()), Count():
        runners.RUN[runner](job, tmp)
    return Count.n


def per_step(runner: str, workload: str = "tiny_mlp", steps: int = 200) -> dict[str, float]:
    """Python calls, C calls, bytecodes and aten ops per optimizer step of ``runner`` on ``workload``.

    Raises:
        ValueError: an unknown runner or workload (names the valid ones).
    """
    from benchmarks.runners import RUN
    from benchmarks.workloads import WORKLOADS

    if runner not in RUN:
        raise ValueError(f"Unknown runner {runner!r}; valid: {', '.join(RUN)}.")
    if workload not in WORKLOADS:
        raise ValueError(f"Unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}.")
    _count(runner, workload, 5, opcodes=False)  # first run: lazy imports, the first optimizer's module loads
    short = [a + b for a, b in zip(_count(runner, workload, SHORT, False), _count(runner, workload, SHORT, True))]
    long = [a + b for a, b in zip(_count(runner, workload, SHORT + steps, False),
                                  _count(runner, workload, SHORT + steps, True))]
    calls, c_calls, ops = ((b - a) / steps for a, b in zip(short, long))
    aten = (_count_aten(runner, workload, SHORT + steps) - _count_aten(runner, workload, SHORT)) / steps
    return {"python_calls": calls, "c_calls": c_calls, "bytecodes": ops, "aten_ops": aten}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the per-step counts of ``--runner`` and the hand-written loop, and their difference."""
    import torch

    torch.set_num_threads(1)
    p = argparse.ArgumentParser(prog="python -m benchmarks.calls", description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", default="taskfit", help="taskfit (default) or engine")
    p.add_argument("--workload", default="tiny_mlp", help="an overhead-suite workload (default tiny_mlp)")
    p.add_argument("--steps", type=int, default=200, help="steps counted (default 200)")
    ns = p.parse_args(argv)
    try:
        mine, raw = per_step(ns.runner, ns.workload, ns.steps), per_step("raw", ns.workload, ns.steps)
    except ValueError as err:
        p.error(str(err))
    print(f"per optimizer step, {ns.workload}, {ns.steps} steps counted")
    print(f"| count | {ns.runner} | hand-written loop | {ns.runner} - loop |\n|---|---|---|---|")
    for key in mine:
        print(f"| {key.replace('_', ' ')} | {mine[key]:.1f} | {raw[key]:.1f} | {mine[key] - raw[key]:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
