"""Entry point of one fresh benchmark process: ``python -m benchmarks.worker TASK SPEC_JSON``.

``TASK`` names a suite module (``overhead``, ``techniques``, ``strategies``, ``checkpoint``, ``packing``) whose
``worker(spec) -> dict`` does the measuring; the dict is written as JSON to ``spec["out"]``. Torch is not
imported here before the suite's worker runs, so the overhead suite can time ``import torch`` itself.
A worker that raises :class:`~benchmarks.common.Skip` or ``NotImplementedError`` writes
``{"skipped": reason}``. Started by :func:`benchmarks.common.run_worker`, which also sets the environment.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

TASKS = ("overhead", "techniques", "strategies", "checkpoint", "packing")


def main(argv: list[str] | None = None) -> int:
    """Run the task; returns the process exit status (0 also for a skipped row, 2 for a usage error)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in TASKS:
        print(f"usage: python -m benchmarks.worker {{{','.join(TASKS)}}} SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    core = spec.get("pin_core")
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(core)})
    from benchmarks.common import Skip

    suite = importlib.import_module(f"benchmarks.{argv[0]}")
    try:
        result = suite.worker(spec)
    except (Skip, NotImplementedError) as err:
        result = {"skipped": str(err)}
    if result.pop("_discard", False):  # a non-zero rank of a multi-process run: rank 0 reports for all
        return 0
    with open(spec["out"], "w") as f:
        json.dump(result, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
