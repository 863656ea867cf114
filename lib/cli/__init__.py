"""The ``taskfit`` command line (``taskfit fit|validate|test|predict|estimate|bench|plot|...``)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``taskfit`` console script (``taskfit.cli:main``): :func:`taskfit.cli.main.main`, imported when called,
    so ``python -m taskfit.cli.main`` runs that module once (no runpy warning) and ``taskfit.cli.main`` stays the
    module once imported."""
    from taskfit.cli.main import main as run

    return run(argv)


__all__ = ["main"]
