"""Lightning's own tests as the judge of ``taskfit.lightning`` (``make peer-lightning PEER_LIGHTNING_DIR=folder``).

The folder holds Lightning's ``tests/tests_pytorch/`` files of the installed Lightning version (from the public
``Lightning-AI/pytorch-lightning`` repository, kept outside this repository: their code is not ours). The script
copies the folder twice into a temporary folder, rewrites in one copy only the imports of the names
``taskfit.lightning`` provides, runs pytest on both copies (CPU only, offline, ``--junitxml``) and prints per test:
passes under Lightning, passes under taskfit, and the reason listed in ``lightning_exceptions.txt``. It exits 1 when
a test that passes under Lightning fails under taskfit without being listed, 2 on a usage error.

What is rewritten (the change the docs ask of a user script, nothing else):

- ``from lightning.pytorch import LightningModule, Trainer, ...`` (also ``from lightning import ...`` and the
  defining submodules such as ``lightning.pytorch.core.module``): the provided names move to
  ``from taskfit.lightning import ...``, the rest stays;
- ``from lightning.pytorch.callbacks import EarlyStopping, ...`` and ``from lightning.pytorch.loggers import ...``
  (and their submodules): the names ``taskfit.lightning.callbacks`` / ``.loggers`` hold are bound from there
  (those two are namespaces, not modules, so the line becomes an import plus assignments);
- ``import lightning.pytorch as pl`` / ``import lightning as L``: swapped to ``import taskfit.lightning as pl`` only
  when every use of the alias in the file is a provided name (``pl.Trainer``, ``pl.callbacks.EarlyStopping``);
- ``lightning.pytorch.demos.boring_classes`` (BoringModel & co., user code written against Lightning): the installed
  file is copied into the taskfit copy as ``tests_pytorch/_taskfit_demos.py`` with the same rewriting, and imports
  of it point there (``--keep-demos`` leaves them on Lightning's classes).

Usage::

    python tests/peers/run_lightning_suite.py FOLDER [--files core/test_datamodules.py ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_EXCEPTIONS = HERE / "lightning_exceptions.txt"
MAIN_FILES = ["core/test_datamodules.py", "callbacks/test_early_stopping.py"]
KINDS = {"1": "Lightning internal", "2": "documented difference"}
TOP_MODULES = {"lightning", "lightning.pytorch"}
# modules whose same-named objects taskfit.lightning provides at its top level (the defining submodules included)
NAME_MODULES = TOP_MODULES | {"lightning.pytorch.core", "lightning.pytorch.core.module", "lightning.pytorch.core.datamodule",
                              "lightning.pytorch.trainer", "lightning.pytorch.trainer.trainer",
                              "lightning.pytorch.callbacks.callback", "lightning.pytorch.utilities.seed",
                              "lightning.fabric", "lightning.fabric.utilities.seed", "lightning.fabric.utilities"}
NAMESPACES = ("callbacks", "loggers")
DEMOS = "lightning.pytorch.demos.boring_classes"
DEMOS_LOCAL = "tests_pytorch._taskfit_demos"


@dataclass
class Provided:
    """What ``taskfit.lightning`` offers: ``top`` (its ``__all__`` minus the namespaces) and the members of its
    ``callbacks`` and ``loggers`` namespaces."""
    top: set[str]
    spaces: dict[str, set[str]]


def _literal_all(path: Path) -> set[str] | None:
    """The literal ``__all__`` of the module at ``path`` (None without one)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = getattr(node.targets[0], "id", None) if isinstance(node, ast.Assign) else None
        if target == "__all__" and len(node.targets) == 1:
            return set(ast.literal_eval(node.value))
    return None


def taskfit_lightning_names() -> Provided:
    """Read ``taskfit.lightning``'s ``__all__`` and those of its ``callbacks``/``loggers`` modules from their
    sources, without importing them (no torch import).

    Raises:
        RuntimeError: when ``taskfit.lightning`` cannot be found or a module has no literal ``__all__``.
    """
    spec = importlib.util.find_spec("taskfit.lightning")
    if spec is None or spec.origin is None:
        raise RuntimeError("taskfit.lightning is not importable from this interpreter")
    package = Path(spec.origin).parent
    top = _literal_all(Path(spec.origin))
    spaces = {n: _literal_all(package / f"{n}.py") for n in NAMESPACES}
    missing = [str(p) for p, names in [(spec.origin, top), *((package / f"{n}.py", v) for n, v in spaces.items())]
               if names is None]
    if missing:
        raise RuntimeError(f"no literal __all__ in {', '.join(missing)}")
    return Provided(top - set(NAMESPACES), spaces)


def _space_of(module: str) -> str | None:
    for space in NAMESPACES:
        if module == f"lightning.pytorch.{space}" or module.startswith(f"lightning.pytorch.{space}."):
            return space
    return None


def _names(aliases: list[ast.alias]) -> str:
    return ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in aliases)


def _from_edit(node: ast.ImportFrom, indent: str, provided: Provided, demos: bool) -> tuple[str, list[str]] | None:
    """The replacement text of one ``from lightning... import`` statement and the names moved; None: unchanged."""
    module = node.module or ""
    if demos and module == DEMOS:
        return f"{indent}from {DEMOS_LOCAL} import {_names(node.names)}\n", [a.name for a in node.names]
    space = _space_of(module)
    ours = [a for a in node.names if (space and a.name in provided.spaces[space])
            or (module in NAME_MODULES and a.name in provided.top)]
    if not ours:
        return None
    rest = [a for a in node.names if a not in ours]
    top = [a for a in ours if a.name in provided.top]
    text = f"{indent}from taskfit.lightning import {_names(top)}\n" if top else ""
    bound = [a for a in ours if a not in top]
    if bound:
        text += f"{indent}from taskfit.lightning import {space} as _taskfit_{space}\n"
        text += "".join(f"{indent}{a.asname or a.name} = _taskfit_{space}.{a.name}\n" for a in bound)
    if rest:
        text += f"{indent}from {module} import {_names(rest)}\n"
    return text, [a.name for a in ours]


def _alias_uses_ok(tree: ast.AST, alias: str, provided: Provided) -> bool:
    """True when every use of the name ``alias`` in ``tree`` is ``alias.<provided>`` or
    ``alias.callbacks.<member>`` / ``alias.loggers.<member>``."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == alias):
            continue
        attr = parents.get(node)
        if not isinstance(attr, ast.Attribute):
            return False
        if attr.attr in provided.top:
            continue
        inner = parents.get(attr)
        if not (attr.attr in NAMESPACES and isinstance(inner, ast.Attribute)
                and inner.attr in provided.spaces[attr.attr]):
            return False
    return True


def rewrite_imports(source: str, provided: Provided, demos: bool = True) -> tuple[str, list[str]]:
    """Move the imports of the names ``taskfit.lightning`` provides from Lightning to it; nothing else changes.

    Module level and nested statements, one line or parenthesised, are replaced at their indentation (see the
    module doc for the forms). Mirrors the import swap docs/lightning.md asks of a user script.

    Args:
        source (str): a Python file's text.
        provided (Provided): what ``taskfit.lightning`` offers.
        demos (bool): point ``lightning.pytorch.demos.boring_classes`` imports at ``tests_pytorch._taskfit_demos``.

    Returns:
        tuple[str, list[str]]: the rewritten text and the moved names (``import ... as X`` counts as ``X``).
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    moved: list[str] = []
    for node in ast.walk(tree):
        first = lines[node.lineno - 1] if isinstance(node, (ast.Import, ast.ImportFrom)) else ""
        indent = first[: len(first) - len(first.lstrip())]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lightning"):
            edit = _from_edit(node, indent, provided, demos)
        elif isinstance(node, ast.Import) and len(node.names) == 1 and node.names[0].name in TOP_MODULES \
                and node.names[0].asname and _alias_uses_ok(tree, node.names[0].asname, provided):
            edit = f"{indent}import taskfit.lightning as {node.names[0].asname}\n", [node.names[0].asname]
        else:
            continue
        if edit is not None:
            edits.append((node.lineno - 1, node.end_lineno, edit[0]))
            moved += edit[1]
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines), moved


def _tests_dir(folder: Path) -> Path:
    for cand in (folder / "tests" / "tests_pytorch", folder / "tests_pytorch", folder):
        if cand.name == "tests_pytorch" and (cand / "conftest.py").is_file():
            return cand
    raise SystemExit(f"run_lightning_suite: no Lightning tests/tests_pytorch folder under {folder}")


def prepare_copies(folder: Path, work: Path, provided: Provided, demos: bool = True) -> dict[str, Path]:
    """Copy ``tests_pytorch`` to ``work/lightning`` and ``work/taskfit`` and rewrite the imports of every file of
    the taskfit copy (helpers and conftest included); with ``demos``, add the rewritten ``_taskfit_demos.py``.

    Returns:
        dict[str, Path]: ``{"lightning": root, "taskfit": root}``, each root holding ``tests_pytorch``.
    """
    src = _tests_dir(folder)
    roots = {}
    for side in ("lightning", "taskfit"):
        shutil.copytree(src, work / side / "tests_pytorch", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (work / side / "pytest.ini").write_text("[pytest]\naddopts =\n", encoding="utf-8")
        roots[side] = work / side
    dest = roots["taskfit"] / "tests_pytorch"
    if demos:
        # located without importing lightning (a top-level find_spec does not run the package)
        path = Path(importlib.util.find_spec("lightning").origin).parent / "pytorch" / "demos" / "boring_classes.py"
        text, _ = rewrite_imports(path.read_text(encoding="utf-8"), provided, demos=False)
        (dest / "_taskfit_demos.py").write_text(text, encoding="utf-8")
    for path in sorted(dest.rglob("*.py")):
        if path.name == "_taskfit_demos.py":
            continue
        text, moved = rewrite_imports(path.read_text(encoding="utf-8"), provided, demos)
        if moved:
            path.write_text(text, encoding="utf-8")
    return roots


def _pytest_cmd(files: list[str], junit: Path, timeout: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--junitxml", str(junit),
           "-o", "junit_family=xunit1"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(timeout)]
    return cmd + [f"tests_pytorch/{f}" for f in files]


def run_side(root: Path, files: list[str], junit: Path, timeout: int) -> subprocess.Popen:
    """Start pytest on ``files`` of one copy: CPU only, offline, one thread; output to ``junit.log``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", WANDB_MODE="disabled",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    log = open(junit.with_suffix(".log"), "w", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(_pytest_cmd(files, junit, timeout), cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


@dataclass
class Outcome:
    """One test's result on one side: ``status`` is ``passed``, ``failed`` or ``skipped``; ``message`` the first
    line of the failure or skip reason."""
    status: str
    message: str = ""


def read_junit(path: Path) -> dict[str, Outcome]:
    """Per-test outcomes of a pytest ``--junitxml`` (xunit1) file, keyed ``dir/file.py::Class::test`` relative to
    ``tests_pytorch`` (``dir/file.py::test`` for a function).

    Returns:
        dict[str, Outcome]: empty when the file is missing (pytest did not run).
    """
    if not path.is_file():
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file", "").replace(os.sep, "/").removeprefix("tests_pytorch/")
        stem = Path(file).stem
        parts = case.get("classname", "").split(".")
        cls = parts[-1] if len(parts) >= 2 and parts[-1] != stem else ""
        key = "::".join(p for p in (file, cls, case.get("name", "")) if p)
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = "skipped" if tag == "skipped" else "failed"
                first = (el.get("message") or el.text or "").strip().splitlines()[0:1]
                message = first[0][:200] if first else ""
                break
        if key in out and out[key].status == "failed":  # a teardown error reported after the call keeps the failure
            continue
        out[key] = Outcome(status, message)
    return out


def read_exceptions(path: Path) -> dict[str, tuple[str, str]]:
    """``lightning_exceptions.txt``: ``test id | kind | reason`` a line (``#`` comments); kind ``1`` (reads a
    Lightning internal, named) or ``2`` (a documented difference, docs/lightning.md row named).

    Raises:
        ValueError: a line without three fields or with another kind.
    """
    out = {}
    if not path.is_file():
        return out
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("|", 2)]
        if len(fields) != 3 or fields[1] not in KINDS or not fields[2]:
            raise ValueError(f"{path}:{n}: expected 'test id | 1 or 2 | reason', got {raw!r}")
        out[fields[0]] = (fields[1], fields[2])
    return out


def _fmt(o: Outcome | None) -> str:
    return "-" if o is None else {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[o.status]


def _line(key: str, pl: Outcome | None, tf: Outcome | None, exceptions: dict, counts: dict) -> str:
    """One test's report line; counts it into ``counts``."""
    note = ""
    if pl is not None and pl.status == "passed":
        counts["pl"] += 1
        if tf is not None and tf.status == "passed":
            counts["tf"] += 1
        elif key in exceptions:
            kind, why = exceptions[key]
            counts[kind] += 1
            note = f"listed ({kind}: {KINDS[kind]}): {why}"
        else:
            counts["unlisted"] += 1
            note = f"UNLISTED: {tf.message if tf else 'did not run under taskfit'}"
    elif key in exceptions:
        note = "listed, but does not pass under Lightning here"
    return f"  Lightning {_fmt(pl):4}  taskfit {_fmt(tf):4}  {key}" + (f"  -- {note}" if note else "")


def report(files: list[str], pl: dict[str, Outcome], tf: dict[str, Outcome],
           exceptions: dict[str, tuple[str, str]]) -> int:
    """Print one line per test and a summary line per file and in total; returns the unlisted failures."""
    total = dict.fromkeys(("pl", "tf", "1", "2", "unlisted"), 0)
    for file in files:
        counts = dict.fromkeys(total, 0)
        print(f"== {file}")
        for key in sorted(k for k in set(pl) | set(tf) if k.split("::", 1)[0] == file):
            print(_line(key, pl.get(key), tf.get(key), exceptions, counts))
        print(f"summary {file}: Lightning-passing {counts['pl']}, taskfit-passing {counts['tf']}, listed kind-1 "
              f"{counts['1']}, kind-2 {counts['2']}, unlisted failures {counts['unlisted']}")
        for k in total:
            total[k] += counts[k]
    print(f"summary all: Lightning-passing {total['pl']}, taskfit-passing {total['tf']}, listed kind-1 {total['1']}, "
          f"kind-2 {total['2']}, unlisted failures {total['unlisted']}")
    return total["unlisted"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="Lightning's tests/tests_pytorch folder (or a folder holding it)")
    p.add_argument("--files", nargs="+", default=None,
                   help="test files relative to tests_pytorch (default: the main files that exist in the folder)")
    p.add_argument("--exceptions", type=Path, default=DEFAULT_EXCEPTIONS)
    p.add_argument("--out", type=Path, default=None, help="keep the junit files and logs here (default: temporary)")
    p.add_argument("--report-only", action="store_true",
                   help="report from the junit files already in --out (all of them, merged)")
    p.add_argument("--keep-demos", action="store_true",
                   help="leave lightning.pytorch.demos imports on Lightning's own classes in the taskfit copy")
    p.add_argument("--timeout", type=int, default=600, help="seconds per test (pytest-timeout)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the files under Lightning and under taskfit (both copies at once) and report; see the module doc."""
    a = _parse(argv)
    if not a.folder.is_dir():
        print(f"run_lightning_suite: {a.folder} is not a folder", file=sys.stderr)
        return 2
    files = a.files or [f for f in MAIN_FILES if (_tests_dir(a.folder) / f).is_file()]
    out = a.out or Path(tempfile.mkdtemp(prefix="peer-lightning-out-"))
    out.mkdir(parents=True, exist_ok=True)
    stem = "_".join(Path(f).stem for f in files) if len(files) < 3 else "suite"
    junit = {side: out / f"{stem}.{side}.xml" for side in ("lightning", "taskfit")}
    if not a.report_only:
        with tempfile.TemporaryDirectory(prefix="peer-lightning-") as work:
            roots = prepare_copies(a.folder, Path(work), taskfit_lightning_names(), demos=not a.keep_demos)
            procs = [run_side(roots[s], files, junit[s], a.timeout) for s in ("lightning", "taskfit")]
            for proc in procs:
                proc.wait()
    merged = {side: {k: v for x in sorted(out.glob(f"*.{side}.xml")) for k, v in read_junit(x).items()}
              for side in ("lightning", "taskfit")}
    unlisted = report(files, merged["lightning"], merged["taskfit"], read_exceptions(a.exceptions))
    print(f"(junit files and logs in {out})")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
