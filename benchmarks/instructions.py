"""CPU instructions per steady-state optimizer step, counted by callgrind (F-BENCH-1): a load-independent measure
that, unlike :mod:`benchmarks.calls`, includes the time spent in torch's C++ code (dispatcher, kernels).

    python -m benchmarks.instructions [--runner taskfit] [--workload tiny_mlp]

Runs the runner and the hand-written loop each in its own process under ``valgrind --tool=callgrind`` with
instrumentation off at start; a client request switches it on at the fetch of batch ``FIRST`` and off at the fetch
of batch ``LAST`` (set-up, imports and the first steps excluded), and prints instructions (``Ir``) per step. Needs
``valgrind`` and a C compiler (the client requests are compiled into a small shared library); takes a few minutes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

FIRST, LAST = 30, 80
_C = ("#include <valgrind/callgrind.h>\n"
      "void taskfit_on(void) { CALLGRIND_START_INSTRUMENTATION; }\n"
      "void taskfit_off(void) { CALLGRIND_STOP_INSTRUMENTATION; }\n")


def _child(runner: str, workload: str, library: str) -> None:
    """Run ``runner`` on ``workload`` for ``LAST + 5`` steps, toggling callgrind at the fetches of FIRST and LAST."""
    import torch

    from benchmarks import runners
    from benchmarks.workloads import TimedBatches, build_job

    torch.set_num_threads(1)
    lib = ctypes.CDLL(library)

    class Toggled(TimedBatches):
        def __getitem__(self, i: int):  # type: ignore[override]
            if i == FIRST:
                lib.taskfit_on()
            elif i == LAST:
                lib.taskfit_off()
            return super().__getitem__(i)

    job = build_job(workload, LAST + 5)
    job.data.__class__ = Toggled
    with tempfile.TemporaryDirectory() as tmp:
        runners.RUN[runner](job, tmp)


def per_step(runner: str, workload: str = "tiny_mlp") -> float:
    """Instructions per steady-state step of ``runner`` (one callgrind run).

    Raises:
        RuntimeError: valgrind or a C compiler is missing, or the run failed (its stderr's tail).
    """
    cc, valgrind = shutil.which("cc") or shutil.which("gcc"), shutil.which("valgrind")
    if cc is None or valgrind is None:
        raise RuntimeError("benchmarks.instructions needs valgrind and a C compiler (cc) on PATH.")
    with tempfile.TemporaryDirectory() as tmp:
        src, lib, out = (os.path.join(tmp, n) for n in ("toggle.c", "toggle.so", "callgrind.out"))
        with open(src, "w") as f:
            f.write(_C)
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", lib, src], check=True)
        cmd = [valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
               "-m", "benchmarks.instructions", "--child", "--runner", runner, "--workload", workload, "--lib", lib]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"callgrind run of {runner!r} failed: {done.stderr[-2000:]}")
        with open(out) as f:
            totals = re.search(r"^totals:\s*(\d+)", f.read(), re.MULTILINE)
    return int(totals.group(1)) / (LAST - FIRST)


def main(argv: Sequence[str] | None = None) -> int:
    """Print instructions per step of ``--runner`` and of the hand-written loop, and their difference."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0])
    p.add_argument("--runner", default="taskfit", help="taskfit (default) or engine")
    p.add_argument("--workload", default="tiny_mlp", help="an overhead-suite workload (default tiny_mlp)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lib", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    from benchmarks.runners import RUN
    from benchmarks.workloads import WORKLOADS

    if ns.runner not in RUN or ns.workload not in WORKLOADS:
        p.error(f"runner {ns.runner!r} / workload {ns.workload!r}: valid runners {', '.join(RUN)}; valid workloads "
                f"{', '.join(WORKLOADS)}")
    if ns.child:
        _child(ns.runner, ns.workload, ns.lib)
        return 0
    mine, raw = per_step(ns.runner, ns.workload), per_step("raw", ns.workload)
    print(f"CPU instructions (callgrind Ir) per optimizer step, {ns.workload}, steps {FIRST}-{LAST}")
    print(f"| {ns.runner} | hand-written loop | {ns.runner} - loop |\n|---|---|---|")
    print(f"| {mine:,.0f} | {raw:,.0f} | {mine - raw:+,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
