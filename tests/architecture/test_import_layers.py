"""The layer order of DESIGN.md, parsed from the sources with ``ast``: a package imports only packages below it,
at module level, inside functions and under ``TYPE_CHECKING`` alike, and no import cycle exists, counting lazy
imports and the edges to a package's ``__init__`` that importing one of its modules runs first.

A "package" here is a top-level unit of ``taskfit``: a sub-package (``taskfit.loops``), a top-level module
(``taskfit.seed``) or one of the two sibling packages (``taskfit.strategies``, ``taskfit.accelerators``).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {"lib": "taskfit", "strategies": "taskfit.strategies", "accelerators": "taskfit.accelerators"}

#: bottom up; a unit imports only units of a lower layer (or itself)
LAYERS: list[tuple[str, ...]] = [
    ("__about__", "registry", "json_options", "protocols", "loggers", "debugging", "redact", "errors"),
    ("io", "precision", "accelerators"),
    ("core", "seed", "metrics"),
    ("optim",),
    ("arguments",),
    ("data",),
    ("strategies", "loops"),
    ("checkpoint", "connector"),
    ("callbacks",),
    ("efficiency",),
    ("fit",),
    ("engine", "cli", "tuner"),
    ("hf", "lightning", "<root>"),  # the doors: Lightning's finder callbacks run the tuner's search
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}

#: deliberate upward imports, ``(importer module, imported module): reason``; at most a handful
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("taskfit.json_options", "taskfit.redact"): "both in the lowest layer: an unparsable JSON option is echoed "
    "with its credentials redacted",
}


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
    """``(imported name, line, kind)`` for every import in ``path``; kind is ``"module"`` (top level),
    ``"lazy"`` (inside a function or class) or ``"typecheck"`` (under ``if TYPE_CHECKING:``). Relative imports
    are resolved; ``from pkg import name`` yields ``pkg.name`` (resolved to a module later when it is one)."""
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
            out.append((base, child.lineno, kind))
            out.extend((f"{base}.{alias.name}", child.lineno, kind) for alias in child.names)
        inner = "lazy" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) \
            and kind == "module" else kind
        if not isinstance(child, (ast.Import, ast.ImportFrom)):
            visit(child, inner)

    visit(tree, "module")
    return out


def unit(module: str) -> str:
    """The top-level unit a module belongs to (``taskfit.loops.state`` -> ``loops``; ``taskfit`` -> ``<root>``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def edges(root: pathlib.Path = ROOT) -> list[tuple[str, str, str, int, str]]:
    """``(importer, imported module, file, line, kind)`` for every import of a taskfit module, the imported name
    resolved to the deepest module that exists, plus the package ``__init__`` edges that importing runs."""
    mods = module_files(root)
    out = []
    for module, path in sorted(mods.items()):
        where = path.relative_to(root).as_posix()
        found: dict[str, tuple[int, str]] = {}
        for name, line, kind in imports(module, path):
            if not name.startswith("taskfit"):
                continue
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mods),
                          None)
            if target is None or target == module:
                continue
            chain = [".".join(target.split(".")[:i]) for i in range(2, len(target.split(".")) + 1)]
            for imported in chain:  # importing a.b.c runs a.b's __init__ first (the root package excepted)
                if imported in mods and imported != module and not module.startswith(imported + "."):
                    found.setdefault(imported, (line, kind))
        out += [(module, imported, where, line, kind) for imported, (line, kind) in sorted(found.items())]
    return out


def violations(root: pathlib.Path = ROOT) -> list[str]:
    """Every import of a unit that is not below the importer's, as ``"file:line: importer -> imported (kind)"``."""
    bad = []
    for module, imported, where, line, kind in edges(root):
        a, b = unit(module), unit(imported)
        if a == b or (module, imported) in EXCEPTIONS:
            continue
        if a not in LAYER or b not in LAYER:
            bad.append(f"{where}:{line}: {module} -> {imported} ({kind}): unit {a if a not in LAYER else b!r} has "
                       "no layer in LAYERS")
        elif LAYER[b] >= LAYER[a]:
            bad.append(f"{where}:{line}: {module} -> {imported} ({kind}): {a} (layer {LAYER[a] + 1}) imports {b} "
                       f"(layer {LAYER[b] + 1})")
    return bad


def cycles(root: pathlib.Path = ROOT) -> list[list[str]]:
    """Strongly connected components (size > 1) of the module graph with every kind of edge."""
    graph: dict[str, set[str]] = {}
    for module, imported, *_ in edges(root):
        if (module, imported) not in EXCEPTIONS:  # a listed upward import is deliberate (and lazy)
            graph.setdefault(module, set()).add(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_every_package_imports_only_packages_below_it():
    bad = violations()
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_no_import_cycle_counting_lazy_imports_and_package_inits():
    found = cycles()
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_unit_has_a_layer():
    units = {unit(m) for m in module_files() if m.startswith("taskfit")}
    assert units <= set(LAYER), f"units without a layer: {sorted(units - set(LAYER))}"


def test_the_checks_see_every_kind_of_import(tmp_path):
    """The checker finds module-level, lazy, TYPE_CHECKING and relative imports, package ``__init__`` edges and
    a cycle (so the tests above can fail)."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir()
    (tmp_path / "lib" / "seed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from taskfit.fit import Fit\n"
        "def f():\n    from taskfit.loops.state import S\n")
    (tmp_path / "lib" / "fit").mkdir()
    (tmp_path / "lib" / "fit" / "__init__.py").write_text("")
    (tmp_path / "lib" / "loops").mkdir()
    (tmp_path / "lib" / "loops" / "__init__.py").write_text("")
    (tmp_path / "lib" / "loops" / "state.py").write_text("from ..seed import f\n")
    (tmp_path / "accelerators" / "gpu.py").write_text("import taskfit.strategies.ddp\n")
    (tmp_path / "strategies" / "__init__.py").write_text("")
    (tmp_path / "strategies" / "ddp.py").write_text("")
    found = violations(tmp_path)
    assert found == [
        "accelerators/gpu.py:1: taskfit.accelerators.gpu -> taskfit.strategies (module): accelerators (layer 2) "
        "imports strategies (layer 7)",
        "accelerators/gpu.py:1: taskfit.accelerators.gpu -> taskfit.strategies.ddp (module): accelerators "
        "(layer 2) imports strategies (layer 7)",
        "lib/seed.py:3: taskfit.seed -> taskfit.fit (typecheck): seed (layer 3) imports fit (layer 11)",
        "lib/seed.py:5: taskfit.seed -> taskfit.loops (lazy): seed (layer 3) imports loops (layer 7)",
        "lib/seed.py:5: taskfit.seed -> taskfit.loops.state (lazy): seed (layer 3) imports loops (layer 7)",
    ], found
    assert cycles(tmp_path) == [["taskfit.loops", "taskfit.loops.state", "taskfit.seed"]] or \
        cycles(tmp_path) == [["taskfit.loops.state", "taskfit.seed"]], cycles(tmp_path)
