"""The ``taskfit`` command line (``taskfit fit|validate|test|predict|estimate|bench|plot|...``)."""

from taskfit.cli.app import main

__all__ = ["main"]
