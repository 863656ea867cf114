"""``python -m benchmarks SUITE [options]``: see :mod:`benchmarks` and ``benchmarks/README.md``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from benchmarks import SUITES


def build_parser(prog: str = "python -m benchmarks") -> argparse.ArgumentParser:
    """The benchmark command line (also used by ``taskfit bench``)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a taskfit benchmark suite; results go to "
        "benchmarks/results/<suite>/ (JSON, Markdown, PNG).",
        epilog="suites: " + "; ".join(f"{k}: {v}" for k, v in SUITES.items()),
    )
    p.add_argument("suite", metavar="SUITE", help=f"one of: {', '.join(SUITES)}")
    p.add_argument(
        "--quick", action="store_true", help="short run (about 30 s); results go to a quick/ subfolder"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="overhead only: exit 1 when taskfit's step-time ratio on "
        "the larger workloads exceeds 1.05 or its weights differ from the hand-written loop's",
    )
    p.add_argument("--out", metavar="DIR", help="results folder (default benchmarks/results/<suite>/)")
    p.add_argument("--reps", type=int, metavar="N", help="repetitions (overhead, checkpoint)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch.set_num_threads in every worker process (default 1; 1 also pins to one core)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="subset of rows: runners for overhead "
        "(raw taskfit engine lightning hf), row names for the other suites",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m benchmarks") -> int:
    """Parse ``argv`` and run the suite; returns the exit status (2 for an unknown suite or bad option)."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    if ns.suite not in SUITES:
        from difflib import get_close_matches

        close = get_close_matches(ns.suite, list(SUITES), n=1)
        hint = f' Did you mean "{close[0]}"?' if close else ""
        parser.error(f"unknown suite {ns.suite!r}.{hint} Valid suites: {', '.join(SUITES)}.")
    if ns.check and ns.suite != "overhead":
        parser.error("--check applies to the overhead suite only.")
    if ns.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is available here.")
    suite = importlib.import_module(f"benchmarks.{ns.suite}")
    kwargs = {
        "quick": ns.quick,
        "out_dir": ns.out,
        "reps": ns.reps,
        "device": ns.device,
        "threads": ns.threads,
    }
    try:
        if ns.suite == "overhead":
            return suite.run_suite(check=ns.check, runners=ns.only, **kwargs)
        return suite.run_suite(only=ns.only, **kwargs)
    except ValueError as err:  # unknown row / runner names: the message lists the valid ones
        parser.error(str(err))


if __name__ == "__main__":
    sys.exit(main())
