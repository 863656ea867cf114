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
- ``from lightning.pytorch.callbacks import EarlyStopping, ...``, ``from lightning.pytorch.loggers import ...`` and
  ``from lightning.pytorch.profilers import ...`` (and their submodules, such as ``lightning.pytorch.profilers.simple``):
  the names ``taskfit.lightning.callbacks`` / ``.loggers`` / ``.profilers`` hold are bound from there (the line
  becomes an import of the module plus assignments, which also covers Lightning's submodule paths);
- ``import lightning.pytorch as pl`` / ``import lightning as L``: swapped to ``import taskfit.lightning as pl`` only
  when every use of the alias in the file is a provided name (``pl.Trainer``, ``pl.callbacks.EarlyStopping``,
  ``pl.profilers.SimpleProfiler``);
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
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from peer_common import Peer, run_and_report

HERE = Path(__file__).resolve().parent
DEFAULT_EXCEPTIONS = HERE / "lightning_exceptions.txt"
PEER = Peer(side="lightning", label="Lightning", tests_root="tests_pytorch",
            env={"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "WANDB_MODE": "disabled"})
#: the counted set (tests/peers/lightning_gaps.md): what users write and see, each file clean (every
#: Lightning-passing test passes under the door or is listed in lightning_exceptions.txt)
MAIN_FILES = [
    # hooks, the module, the datamodule, the loops
    "models/test_hooks.py", "core/test_lightning_module.py", "core/test_datamodules.py", "loops/test_loops.py",
    # checkpoints, hyperparameters, restore
    "checkpointing/test_model_checkpoint.py", "checkpointing/test_checkpoint_callback_frequency.py",
    "checkpointing/test_trainer_checkpoint.py", "models/test_hparams.py", "core/test_saving.py",
    "models/test_restore.py",
    # Trainer flags
    "trainer/flags/test_barebones.py", "trainer/flags/test_check_val_every_n_epoch.py",
    "trainer/flags/test_env_vars.py", "trainer/flags/test_fast_dev_run.py", "trainer/flags/test_inference_mode.py",
    "trainer/flags/test_limit_batches.py", "trainer/flags/test_min_max_epochs.py",
    "trainer/flags/test_overfit_batches.py", "trainer/flags/test_val_check_interval.py",
    # self.log and the loggers
    "trainer/logging_/test_distributed_logging.py", "trainer/logging_/test_eval_loop_logging.py",
    "trainer/logging_/test_logger_connector.py", "trainer/logging_/test_loop_logging.py",
    "trainer/logging_/test_train_loop_logging.py", "loggers/test_csv.py", "loggers/test_tensorboard.py",
    # optimization
    "trainer/optimization/test_backward_calls.py", "trainer/optimization/test_manual_optimization.py",
    "trainer/optimization/test_multiple_optimizers.py", "trainer/optimization/test_optimizers.py",
    # callbacks
    "callbacks/test_early_stopping.py", "callbacks/test_lambda_function.py", "callbacks/test_lr_monitor.py",
    "callbacks/test_finetuning_callback.py", "callbacks/test_timer.py", "callbacks/test_prediction_writer.py",
    "callbacks/test_gradient_accumulation_scheduler.py", "callbacks/test_callbacks.py",
    "trainer/connectors/test_callback_connector.py", "callbacks/test_model_summary.py",
    "utilities/test_model_summary.py",
]
TOP_MODULES = {"lightning", "lightning.pytorch"}
# modules whose same-named objects taskfit.lightning provides at its top level (the defining submodules included)
NAME_MODULES = TOP_MODULES | {"lightning.pytorch.core", "lightning.pytorch.core.module", "lightning.pytorch.core.datamodule",
                              "lightning.pytorch.trainer", "lightning.pytorch.trainer.trainer",
                              "lightning.pytorch.callbacks.callback", "lightning.pytorch.utilities.seed",
                              "lightning.fabric", "lightning.fabric.utilities.seed", "lightning.fabric.utilities",
                              "lightning.pytorch.utilities", "lightning.pytorch.utilities.model_helpers",
                              "lightning.fabric.utilities.warnings", "lightning.pytorch.utilities.exceptions",
                              "lightning.fabric.utilities.exceptions"}
NAMESPACES = ("callbacks", "loggers", "profilers")
DEMOS = "lightning.pytorch.demos.boring_classes"
DEMOS_LOCAL = "tests_pytorch._taskfit_demos"


@dataclass
class Provided:
    """What ``taskfit.lightning`` offers: ``top`` (its ``__all__`` minus the namespaces) and the members of its
    ``callbacks``, ``loggers`` and ``profilers`` modules (a namespace missing here provides nothing)."""
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
    """Read ``taskfit.lightning``'s ``__all__`` and those of its ``callbacks``/``loggers``/``profilers`` modules from
    their sources, without importing them (no torch import).

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


def _space_uses_ok(tree: ast.AST | None, name: str, provided: Provided) -> bool:
    """True when every use of the namespace ``name`` (``callbacks``, ``loggers``, ``profilers``) imported as a
    module in ``tree`` is ``name.<member taskfit.lightning's module of that name provides>``."""
    if tree is None or name not in provided.spaces:
        return False
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name]
    return all(isinstance(parents.get(n), ast.Attribute) and parents[n].attr in provided.spaces[name] for n in uses)


def _from_edit(node: ast.ImportFrom, indent: str, provided: Provided, demos: bool,
               tree: ast.AST | None = None) -> tuple[str, list[str]] | None:
    """The replacement text of one ``from lightning... import`` statement and the names moved; None: unchanged.
    ``from lightning.pytorch import callbacks`` moves when ``tree`` uses only members taskfit provides."""
    module = node.module or ""
    if demos and module == DEMOS:
        return f"{indent}from {DEMOS_LOCAL} import {_names(node.names)}\n", [a.name for a in node.names]
    space = _space_of(module)
    spaces = {a.name for a in node.names if module in NAME_MODULES and a.name in NAMESPACES and a.asname is None
              and _space_uses_ok(tree, a.name, provided)}
    ours = [a for a in node.names if (space and a.name in provided.spaces.get(space, ()))
            or (module in NAME_MODULES and (a.name in provided.top or a.name in spaces))]
    if not ours:
        return None
    rest = [a for a in node.names if a not in ours]
    top = [a for a in ours if a.name in provided.top or a.name in spaces]
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
                and inner.attr in provided.spaces.get(attr.attr, ())):
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
            edit = _from_edit(node, indent, provided, demos, tree)
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
    prepare = None if a.report_only else (
        lambda work: prepare_copies(a.folder, work, taskfit_lightning_names(), demos=not a.keep_demos))
    return run_and_report(PEER, files, a.out, a.exceptions, a.timeout, prepare)


if __name__ == "__main__":
    sys.exit(main())
