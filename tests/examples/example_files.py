"""What the example tests share: the repository's ``examples/`` folder, loading one example script as a module,
and whether the optional packages an example needs are installed."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def installed(name: str) -> bool:
    """Whether module ``name`` (dotted names too) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return False


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` imported as module ``taskfit_example_<name>`` (registered in ``sys.modules``:
    dataclasses resolve their module through it)."""
    spec = importlib.util.spec_from_file_location(f"taskfit_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
