"""Hugging Face's own Trainer tests as the judge of ``taskfit.hf`` (``make peer-hf PEER_HF_DIR=folder``).

The folder holds transformers' ``tests/trainer/*.py`` files of the installed transformers version (fetched from the
public ``huggingface/transformers`` repository and kept outside this repository: their code is not ours). The script
copies the folder twice into a temporary folder, rewrites in one copy only the import lines of the names
``taskfit.hf`` provides (``from transformers import Trainer, AutoModel`` becomes ``from taskfit.hf import Trainer``
plus ``from transformers import AutoModel``; the same for ``transformers.trainer_callback`` and the other Trainer
modules), runs pytest on both copies (CPU only, offline, ``--junitxml``), and prints per test: passes under HF,
passes under taskfit, and the reason listed in ``hf_exceptions.txt``. It exits 1 when a test that passes under HF
fails under taskfit without being listed, 2 on a usage error.

Usage::

    python tests/peers/run_hf_suite.py FOLDER [--files test_trainer.py ...] [--out DIR] [--report-only]

``FOLDER`` is either transformers' ``tests/trainer`` folder itself or a folder holding ``tests/trainer/``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
import sys
from pathlib import Path

from peer_common import Peer, run_and_report

HERE = Path(__file__).resolve().parent
DEFAULT_EXCEPTIONS = HERE / "hf_exceptions.txt"
PEER = Peer(side="hf", label="HF", tests_root="tests/trainer",
            env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
                 "TOKENIZERS_PARALLELISM": "false"})
MAIN_FILES = ["test_trainer.py", "test_trainer_callback.py", "test_trainer_evaluation.py",
              "test_trainer_checkpointing.py"]
# the transformers modules a user script imports the Trainer names from; only these lines are rewritten
TRAINER_MODULES = {"transformers", "transformers.trainer", "transformers.trainer_callback",
                   "transformers.training_args", "transformers.training_args_seq2seq", "transformers.trainer_utils",
                   "transformers.trainer_seq2seq"}


def taskfit_hf_names() -> list[str]:
    """``taskfit.hf.__all__``, read from the module's source without importing it (no torch import).

    Returns:
        list[str]: the public names of ``taskfit.hf``.

    Raises:
        RuntimeError: when ``taskfit.hf`` cannot be found or has no literal ``__all__``.
    """
    spec = importlib.util.find_spec("taskfit.hf")
    if spec is None or spec.origin is None:
        raise RuntimeError("taskfit.hf is not importable from this interpreter")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no __all__ in {spec.origin}")


def _render(indent: str, module: str, aliases: list[ast.alias]) -> str:
    names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in aliases)
    return f"{indent}from {module} import {names}\n"


def rewrite_imports(source: str, names: set[str]) -> tuple[str, list[str]]:
    """Move the imports of ``names`` from transformers' Trainer modules to ``taskfit.hf``; nothing else changes.

    Each ``from transformers[.trainer_*] import ...`` statement (module level or nested, one line or parenthesised
    over several) that names one of ``names`` is replaced, at its indentation, by ``from taskfit.hf import <those>``
    followed by ``from <module> import <the rest>`` when anything is left. Mirrors the one-line change the README
    asks of a user script.

    Args:
        source (str): a Python file's text.
        names (set[str]): the names ``taskfit.hf`` provides.

    Returns:
        tuple[str, list[str]]: the rewritten text and the moved names, in order of appearance.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    moved: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in TRAINER_MODULES):
            continue
        ours = [a for a in node.names if a.name in names]
        if not ours:
            continue
        rest = [a for a in node.names if a.name not in names]
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        text = _render(indent, "taskfit.hf", ours) + (_render(indent, node.module, rest) if rest else "")
        edits.append((node.lineno - 1, node.end_lineno, text))
        moved += [a.name for a in ours]
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines), moved


def _trainer_dir(folder: Path) -> Path:
    for cand in (folder / "tests" / "trainer", folder):
        if (cand / "trainer_test_utils.py").is_file() or any(cand.glob("test_trainer*.py")):
            return cand
    raise SystemExit(f"run_hf_suite: no transformers tests/trainer files under {folder}")


def prepare_copies(folder: Path, work: Path, names: set[str]) -> dict[str, Path]:
    """Copy the trainer test folder to ``work/hf/tests/trainer`` and ``work/taskfit/tests/trainer`` (packages, so
    the files' relative imports work) and rewrite the imports in the taskfit copy.

    Returns:
        dict[str, Path]: ``{"hf": root, "taskfit": root}``, each root holding ``tests/trainer``.
    """
    src = _trainer_dir(folder)
    roots = {}
    for side in ("hf", "taskfit"):
        dest = work / side / "tests" / "trainer"
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for pkg in (dest.parent, dest):
            (pkg / "__init__.py").touch()
        (work / side / "pytest.ini").write_text("[pytest]\naddopts =\n", encoding="utf-8")
        roots[side] = work / side
    for path in sorted((roots["taskfit"] / "tests" / "trainer").glob("*.py")):
        text, moved = rewrite_imports(path.read_text(encoding="utf-8"), names)
        if moved:
            path.write_text(text, encoding="utf-8")
    return roots


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="transformers' tests/trainer folder (or a folder holding tests/trainer)")
    p.add_argument("--files", nargs="+", default=None,
                   help="test files to run (default: the four main files that exist in the folder)")
    p.add_argument("--exceptions", type=Path, default=DEFAULT_EXCEPTIONS)
    p.add_argument("--out", type=Path, default=None, help="keep the junit files and logs here (default: temporary)")
    p.add_argument("--report-only", action="store_true",
                   help="report from the junit files already in --out (all of them, merged)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per test (pytest-timeout)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the files under transformers and under taskfit (both copies at once) and report; see the module doc."""
    a = _parse(argv)
    if not a.folder.is_dir():
        print(f"run_hf_suite: {a.folder} is not a folder", file=sys.stderr)
        return 2
    files = a.files or [f for f in MAIN_FILES if (_trainer_dir(a.folder) / f).is_file()]
    prepare = None if a.report_only else (
        lambda work: prepare_copies(a.folder, work, set(taskfit_hf_names())))
    return run_and_report(PEER, files, a.out, a.exceptions, a.timeout, prepare)


if __name__ == "__main__":
    sys.exit(main())
