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
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_EXCEPTIONS = HERE / "hf_exceptions.txt"
MAIN_FILES = ["test_trainer.py", "test_trainer_callback.py", "test_trainer_evaluation.py",
              "test_trainer_checkpointing.py"]
# the transformers modules a user script imports the Trainer names from; only these lines are rewritten
TRAINER_MODULES = {"transformers", "transformers.trainer", "transformers.trainer_callback",
                   "transformers.training_args", "transformers.training_args_seq2seq", "transformers.trainer_utils",
                   "transformers.trainer_seq2seq"}
KINDS = {"1": "HF internal", "2": "documented difference"}


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


def _pytest_cmd(files: list[str], junit: Path, timeout: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--junitxml", str(junit),
           "-o", "junit_family=xunit1"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(timeout)]
    return cmd + [f"tests/trainer/{f}" for f in files]


def run_side(root: Path, files: list[str], junit: Path, timeout: int) -> subprocess.Popen:
    """Start pytest on ``files`` of one copy: CPU only, offline, one thread; output to ``junit.log``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")
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
    """Per-test outcomes of a pytest ``--junitxml`` file, keyed ``file.py::Class::test`` (``file.py::test``).

    Returns:
        dict[str, Outcome]: empty when the file is missing (pytest did not run).
    """
    if not path.is_file():
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        file = parts[-2] if len(parts) >= 2 and parts[-2].startswith("test") else parts[-1]
        cls = parts[-1] if len(parts) >= 2 and parts[-2].startswith("test") else ""
        key = "::".join(p for p in (f"{file}.py", cls, case.get("name", "")) if p)
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = "skipped" if tag == "skipped" else "failed"
                message = (el.get("message") or el.text or "").strip().splitlines()[0:1]
                message = message[0][:200] if message else ""
                break
        out[key] = Outcome(status, message)
    return out


def read_exceptions(path: Path) -> dict[str, tuple[str, str]]:
    """``hf_exceptions.txt``: ``test id | kind | reason`` a line (``#`` comments); kind ``1`` (reads an HF
    internal, named) or ``2`` (a documented difference, docs/hf.md row named).

    Raises:
        ValueError: a line without three fields or with another kind.
    """
    out = {}
    if not path.is_file():
        return out
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if raw.lstrip().startswith("#") else raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split("|", 2)]
        if len(fields) != 3 or fields[1] not in KINDS or not fields[2]:
            raise ValueError(f"{path}:{n}: expected 'test id | 1 or 2 | reason', got {raw!r}")
        out[fields[0]] = (fields[1], fields[2])
    return out


def _fmt(o: Outcome | None) -> str:
    return "-" if o is None else {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[o.status]


def report(files: list[str], hf: dict[str, Outcome], tf: dict[str, Outcome],
           exceptions: dict[str, tuple[str, str]]) -> int:
    """Print one line per test and a summary line per file and in total; returns the unlisted failures."""
    total = {"hf": 0, "tf": 0, "1": 0, "2": 0, "unlisted": 0}
    for file in files:
        counts = {"hf": 0, "tf": 0, "1": 0, "2": 0, "unlisted": 0}
        keys = sorted(k for k in set(hf) | set(tf) if k.split("::", 1)[0] == file)
        print(f"== {file}")
        for key in keys:
            h, t = hf.get(key), tf.get(key)
            note = ""
            if h is not None and h.status == "passed":
                counts["hf"] += 1
                if t is not None and t.status == "passed":
                    counts["tf"] += 1
                elif key in exceptions:
                    kind, why = exceptions[key]
                    counts[kind] += 1
                    note = f"listed ({kind}: {KINDS[kind]}): {why}"
                else:
                    counts["unlisted"] += 1
                    note = f"UNLISTED: {t.message if t else 'did not run under taskfit'}"
            elif key in exceptions:
                note = "listed, but does not pass under HF here"
            print(f"  HF {_fmt(h):4}  taskfit {_fmt(t):4}  {key}" + (f"  -- {note}" if note else ""))
        print(f"summary {file}: HF-passing {counts['hf']}, taskfit-passing {counts['tf']}, listed kind-1 "
              f"{counts['1']}, kind-2 {counts['2']}, unlisted failures {counts['unlisted']}")
        for k in total:
            total[k] += counts[k]
    print(f"summary all: HF-passing {total['hf']}, taskfit-passing {total['tf']}, listed kind-1 {total['1']}, "
          f"kind-2 {total['2']}, unlisted failures {total['unlisted']}")
    return total["unlisted"]


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
    out = a.out or Path(tempfile.mkdtemp(prefix="peer-hf-out-"))
    out.mkdir(parents=True, exist_ok=True)
    stem = "_".join(Path(f).stem for f in files) if len(files) < 3 else "suite"
    junit = {side: out / f"{stem}.{side}.xml" for side in ("hf", "taskfit")}
    if not a.report_only:
        with tempfile.TemporaryDirectory(prefix="peer-hf-") as work:
            roots = prepare_copies(a.folder, Path(work), set(taskfit_hf_names()))
            procs = [run_side(roots[s], files, junit[s], a.timeout) for s in ("hf", "taskfit")]
            for proc in procs:
                proc.wait()
    # every junit file in ``out`` counts (keys carry the file name), so runs of single files can be reported together
    merged = {side: {k: v for x in sorted(out.glob(f"*.{side}.xml")) for k, v in read_junit(x).items()}
              for side in ("hf", "taskfit")}
    unlisted = report(files, merged["hf"], merged["taskfit"], read_exceptions(a.exceptions))
    print(f"(junit files and logs in {out})")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
