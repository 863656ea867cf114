"""Import layering of DESIGN.md (issue 13, item 6), parsed from the sources with ``ast``:

- ``taskfit.accelerators`` imports no ``taskfit.strategies`` (any import: module level, inside functions or for
  type checking);
- ``taskfit.strategies`` imports neither ``taskfit.fit`` nor ``taskfit.loops`` (any import);
- nothing below ``Fit`` imports ``taskfit.fit`` at run time (type-checking-only imports are fine); above it are
  only ``Fit``'s own modules, the package's lazy exports and the command line.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"lib": "taskfit", "strategies": "taskfit.strategies", "accelerators": "taskfit.accelerators"}
#: modules allowed to import taskfit.fit at run time: Fit itself and what sits above it
ABOVE_FIT = {"taskfit", "taskfit.fit", "taskfit.fit_mixins", "taskfit.cli", "taskfit.hf", "taskfit.tuner"}


def module_files(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` for the three source folders (the ``package_dir`` mapping)."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, path: pathlib.Path) -> list[tuple[str, int, str]]:
    """``(imported module, line, kind)`` for every import in ``path``; kind is ``"module"`` (top level),
    ``"lazy"`` (inside a function or class) or ``"typecheck"`` (under ``if TYPE_CHECKING:``). Relative imports
    are resolved; ``from taskfit import Fit`` counts as importing ``taskfit.fit``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    visit_one(sub, "typecheck")
                for sub in child.orelse:
                    visit_one(sub, kind)
                continue
            visit_one(child, kind)

    def visit_one(child: ast.AST, kind: str) -> None:
        if isinstance(child, ast.Import):
            out.extend((a.name, child.lineno, kind) for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (child.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in child.names:
                out.append((f"{base}.{alias.name}" if base == "taskfit" else base, child.lineno, kind))
        inner = "lazy" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) \
            and kind == "module" else kind
        if not isinstance(child, (ast.Import, ast.ImportFrom)):
            visit(child, inner)

    visit(tree, "module")
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: pathlib.Path = ROOT) -> list[str]:
    """Every import that breaks one of the three rules, as ``"file:line: importer -> imported (kind): rule"``."""
    bad = []
    lexicon = {"taskfit.Fit": "taskfit.fit", "taskfit.TrainOutput": "taskfit.fit"}
    for module, path in sorted(module_files(root).items()):
        where = path.relative_to(root).as_posix()
        for imported, line, kind in imports(module, path):
            imported = lexicon.get(imported, imported)
            if _under(module, "taskfit.accelerators") and _under(imported, "taskfit.strategies"):
                bad.append(f"{where}:{line}: {module} -> {imported} ({kind}): accelerators import no strategy")
            if _under(module, "taskfit.strategies") and (
                    _under(imported, "taskfit.fit") or _under(imported, "taskfit.loops")):
                bad.append(f"{where}:{line}: {module} -> {imported} ({kind}): strategies import neither Fit nor "
                           "the loops")
            if module not in ABOVE_FIT and _under(imported, "taskfit.fit") and kind != "typecheck":
                bad.append(f"{where}:{line}: {module} -> {imported} ({kind}): nothing below Fit imports it at "
                           "run time")
    return bad


def test_import_layering_of_the_design():
    bad = violations()
    assert not bad, "imports that point up:\n" + "\n".join(bad)


def test_the_layering_check_sees_every_kind_of_import(tmp_path):
    """The checker finds module-level, lazy and relative imports and exempts only TYPE_CHECKING ones from the
    run-time rule (so the test above can fail)."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir()
    (tmp_path / "lib" / "fit.py").write_text("")
    (tmp_path / "lib" / "helper.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from taskfit.fit import Fit\n"
        "def f():\n    from taskfit import Fit\n")
    (tmp_path / "lib" / "loops").mkdir()
    (tmp_path / "lib" / "loops" / "fit_loop.py").write_text("")
    (tmp_path / "accelerators" / "gpu.py").write_text("import taskfit.strategies.ddp\n")
    (tmp_path / "strategies" / "__init__.py").write_text("")
    (tmp_path / "strategies" / "ddp.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from taskfit.loops.fit_loop import FitLoop\n"
        "class S:\n    def m(self):\n        from ..fit import Fit\n")
    found = violations(tmp_path)
    assert found == [
        "accelerators/gpu.py:1: taskfit.accelerators.gpu -> taskfit.strategies.ddp (module): accelerators import "
        "no strategy",
        "lib/helper.py:5: taskfit.helper -> taskfit.fit (lazy): nothing below Fit imports it at run time",
        "strategies/ddp.py:3: taskfit.strategies.ddp -> taskfit.loops.fit_loop (typecheck): strategies import "
        "neither Fit nor the loops",
        "strategies/ddp.py:6: taskfit.strategies.ddp -> taskfit.fit (lazy): strategies import neither Fit nor the "
        "loops",
        "strategies/ddp.py:6: taskfit.strategies.ddp -> taskfit.fit (lazy): nothing below Fit imports it at run "
        "time",
    ], found
