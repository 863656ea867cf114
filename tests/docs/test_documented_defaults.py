"""The documented differences are checked against the code: the tables of defaults and differences in README.md
and docs/ (docs/hf.md's argument table, docs/lightning.md's mapping) are parsed here and every default they state
is compared with the real value, taskfit's from ``FitArguments`` and transformers' from its own
``TrainingArguments`` (the peer is the oracle). docs/hf.md says every other field has transformers' default: that
is checked too, so a new difference that is not in the table fails here."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from taskfit import FitArguments

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_CELL = re.compile(r"(?<!\\)\|")


def tables(path: Path) -> list[list[list[str]]]:
    """The Markdown tables of ``path``: a list of tables, each a list of rows (header first, the ``|---|`` line
    dropped), each a list of cell texts (``\\|`` inside a cell kept as ``|``)."""
    out: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip().strip("|"))]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            out.append(current)
            current = []
    return out


def _literal(text: str):
    return ast.literal_eval(text.strip())


def _field_default(cls, name: str):
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _hf():
    transformers = pytest.importorskip("transformers")
    return transformers.TrainingArguments


def _argument_table() -> list[list[str]]:
    found = [t for t in tables(ROOT / "docs" / "hf.md") if t[0] == ["Option", "transformers 5", "taskfit"]]
    assert len(found) == 1, "docs/hf.md has no 'Option | transformers 5 | taskfit' table"
    return found[0][1:]


def _names(cell: str) -> list[str]:
    fields = {f.name for f in dataclasses.fields(FitArguments)}
    return [n for n in re.findall(r"`(\w+)", cell) if n in fields]


def _resolved(cls, name: str, value=dataclasses.MISSING):
    """The value of option ``name`` once the arguments object is built (``__post_init__`` ran), with ``name``
    left at its default or set to ``value``; ``output_dir`` is given unless it is the option looked at."""
    kw = {} if name == "output_dir" else {"output_dir": "documented-defaults"}
    if value is not dataclasses.MISSING:
        kw[name] = value
    return getattr(cls(**kw), name)


def _claims(cell: str, name: str, cls) -> list[tuple[str, object, object]]:
    """``(claim text, stated, real)`` for each default a cell of the argument table states about ``name``."""
    out = []
    for m in re.finditer(r"default `([^`]+)`", cell):
        out.append((m.group(0), _literal(m.group(1)), _field_default(cls, name)))
    for m in re.finditer(r"`None` becomes `([^`]+)`", cell):
        out.append((m.group(0), _literal(m.group(1)), _resolved(cls, name, None)))
    if "`None` stays `None`" in cell:
        out.append(("`None` stays `None`", None, _resolved(cls, name, None)))
    for m in re.finditer(r"normali[sz]ed to [^(]*\(`([^`]+)`\)", cell):
        out.append((m.group(0), _literal(m.group(1)), _resolved(cls, name)))
    return out


def test_F_HF_1_argument_table_states_the_real_defaults_of_both_sides():
    """Each default the 'Option | transformers 5 | taskfit' table of docs/hf.md states (``default `X```, ```None``
    becomes `X```, ```None`` stays ``None```, ``normalised to ... (`X`)``) is the real one: transformers' column
    against ``transformers.TrainingArguments``, taskfit's against ``FitArguments``."""
    hf = _hf()
    checked, wrong = 0, []
    for row in _argument_table():
        for name in _names(row[0]):
            for cls, cell in ((hf, row[1]), (FitArguments, row[2])):
                for claim, stated, real in _claims(cell, name, cls):
                    checked += 1
                    if stated != real:
                        wrong.append(f"{name}: {cls.__name__} {claim!r} but the real value is {real!r}")
    assert wrong == []
    assert checked >= 5  # report_to on both sides, output_dir on both sides, fsdp on both sides: the parser works


def test_F_HF_1_every_undocumented_option_has_transformers_default():
    """docs/hf.md: every field of transformers' ``TrainingArguments`` has the same default in taskfit, except the
    options of its table. Both the declared default and the value once built (``__post_init__``) are compared,
    so a difference nobody wrote down fails here."""
    hf = _hf()
    documented = {n for row in _argument_table() for n in _names(row[0])}
    differ = []
    for f in dataclasses.fields(hf):
        if f.name in documented or f.name.startswith("_") or not f.init:
            continue
        ours = {g.name for g in dataclasses.fields(FitArguments)}
        assert f.name in ours, f"transformers' option {f.name!r} is missing from FitArguments"
        if _field_default(hf, f.name) != _field_default(FitArguments, f.name):
            theirs, mine = _field_default(hf, f.name), _field_default(FitArguments, f.name)
            differ.append(f"{f.name}: declared {theirs!r} vs {mine!r}")
            continue
        theirs, mine = _resolved(hf, f.name), _resolved(FitArguments, f.name)
        if type(theirs).__module__.startswith("transformers") or type(theirs).__module__.startswith("accelerate"):
            theirs = dataclasses.asdict(theirs) if dataclasses.is_dataclass(theirs) else theirs
        if theirs != mine and not (callable(theirs) or callable(mine)):
            differ.append(f"{f.name}: built {theirs!r} vs {mine!r}")
    assert differ == [], "differences missing from the table of docs/hf.md: " + "; ".join(differ)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_F_OBS_7_defaults_stated_in_table_cells_are_real(doc):
    """A table cell anywhere in these docs that says ```option`` (default X`` (e.g. docs/lightning.md:
    ``max_grad_norm`` (default 1.0)) states ``FitArguments``' real default."""
    wrong = []
    for table in tables(doc):
        for row in table[1:]:
            for cell in row:
                for m in re.finditer(r"`(\w+)` \(default ([^;)]+)", cell):
                    name, stated = m.group(1), m.group(2).strip().strip("`")
                    if name not in {f.name for f in dataclasses.fields(FitArguments)}:
                        continue
                    real = _field_default(FitArguments, name)
                    if _literal(stated) != real:
                        wrong.append(f"{doc.name}: {m.group(0)!r} but FitArguments().{name} defaults to {real!r}")
    assert wrong == []
