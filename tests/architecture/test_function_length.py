"""No function in ``lib/``, ``strategies/`` or ``accelerators/`` is longer than 80 lines (DESIGN.md: "no function
over 80 lines"), counted from its ``def`` line to its last line, decorators and docstring included. The few
exceptions are listed with their reason; the list only shrinks."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 80
#: ``"path:function"``: reason
EXCEPTIONS: dict[str, str] = {
}


def long_functions(root: pathlib.Path = ROOT, limit: int = LIMIT) -> dict[str, int]:
    """``{"path:function": lines}`` for every function (or method) over ``limit`` lines."""
    out = {}
    for folder in ("lib", "strategies", "accelerators"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    lines = node.end_lineno - first + 1
                    if lines > limit:
                        out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def test_no_function_over_80_lines():
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in EXCEPTIONS}
    assert not new, f"functions over {LIMIT} lines: {new}"
    stale = sorted(set(EXCEPTIONS) - set(found))
    assert not stale, f"listed exceptions that are now short (remove them from EXCEPTIONS): {stale}"


def test_the_length_check_counts_decorators_and_bodies(tmp_path):
    (tmp_path / "lib").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "lib" / "m.py").write_text(f"@staticmethod\ndef f():\n{body}\n\ndef g():\n    pass\n")
    assert long_functions(tmp_path) == {"lib/m.py:f": 81}
