"""Device knowledge lives on the Accelerator (issue 13, item 4): ``lib/`` (the package ``taskfit``) asks the run's
accelerator instead of reading ``torch.cuda`` / ``torch.mps`` / ``torch.backends.*`` / ``torch_xla`` itself or
branching on a device-kind string. Parsed with ``ast``; fails naming each new place.

The allow-list is small and says why each entry is not a device decision."""

from __future__ import annotations

import ast
import pathlib

LIB = pathlib.Path(__file__).resolve().parents[2] / "lib"

#: attribute chains that read device facts (``torch.cuda.is_available()``, ``torch.backends.mps...``)
DEVICE_MODULES = ("torch.cuda", "torch.mps", "torch.backends.cuda", "torch.backends.mps", "torch.backends.cudnn",
                  "torch.xpu", "torch_xla")
DEVICE_KINDS = {"cuda", "mps", "xla", "xpu", "cpu"}

#: (file relative to lib/, what) -> why it stays
ALLOWED = {
    ("seed.py", "torch.backends.cudnn"): "enable_full_determinism sets PyTorch's process-wide determinism switches "
                                         "(HF enable_full_determinism), whatever the device",
    ("callbacks/xla_metrics.py", "torch_xla"): "the tpu_metrics_debug callback prints torch_xla's own metrics "
                                               "report; it runs only under the XLA accelerator",
    ("precision/precision.py", "device-kind comparison"): "GradScaler's own device list (torch.amp), checked again "
                                                     "when a plugin is set up outside the connector",
    ("optim/optimizers.py", "device-kind comparison"): "the fused AdamW default follows where the parameters are "
                                                   "(a tensor fact, as torch's own fused-kernel check)",
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _findings(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name:
                for mod in DEVICE_MODULES:
                    if name == mod or name.startswith(mod + "."):
                        out.append((node.lineno, mod))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if n == "torch_xla" or n.startswith("torch_xla."):
                    out.append((node.lineno, "torch_xla"))
        elif isinstance(node, ast.Compare):
            # `x.type == "cuda"`, `kind in ("cpu", "cuda")`: a device-kind decision
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "type" or isinstance(o, ast.Name) and o.id == "kind"
                   for o in operands):
                consts = [c for o in operands for c in ([o] if isinstance(o, ast.Constant) else getattr(o, "elts", []))]
                if any(isinstance(c, ast.Constant) and c.value in DEVICE_KINDS for c in consts):
                    out.append((node.lineno, "device-kind comparison"))
    return sorted(set(out))


def test_lib_reads_no_device_facts_outside_the_accelerator():
    """Every torch.cuda / torch.mps / torch.backends / torch_xla use and every device-kind comparison in lib/ is
    either gone or on the documented allow-list."""
    bad, used = [], set()
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(LIB).as_posix()
        for line, what in _findings(path):
            if (rel, what) in ALLOWED:
                used.add((rel, what))
            else:
                bad.append(f"lib/{rel}:{line}: {what}")
    assert not bad, "device knowledge outside the Accelerator (ask strategy.accelerator instead):\n" + "\n".join(bad)
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_scan_finds_device_reads(tmp_path):
    """The scanner itself catches the patterns it is meant to (so the test above can fail)."""
    sample = tmp_path / "m.py"
    sample.write_text("import torch\nimport torch_xla.core.xla_model as xm\n"
                      "a = torch.cuda.is_available()\nb = torch.backends.mps.is_available()\n"
                      "c = t.device.type == 'cuda'\nd = kind in ('cpu', 'mps')\n")
    found = {what for _, what in _findings(sample)}
    assert found == {"torch_xla", "torch.cuda", "torch.backends.mps", "device-kind comparison"}
    assert len(_findings(sample)) == 5
