"""F-OBS-7: every ```python block of README.md and docs/*.md runs as written: each block is a self-contained
script, executed in a process of its own in an empty folder (its own tiny data; nothing downloaded). User-facing
docs name no internal feature IDs and no files outside the repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, m in enumerate(_BLOCK.finditer(doc.read_text())):
            out.append((f"{doc.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


BLOCKS = _blocks()


QUICK_START = "README.md#1"
# the quick start runs twice in one interpreter, each time in its own folder, printing a marker after each run: a
# fresh interpreter starts torch's generator from the same default seed, so only a second run in the same process
# (its random state moved on by the first) shows whether the script's results depend on its own seed
_TWICE = """import os, runpy
for run in ("first", "second"):
    os.makedirs(run)
    os.chdir(run)
    runpy.run_path(os.path.join("..", "block.py"), run_name="__main__")
    os.chdir("..")
    print("=== end of run", flush=True)
"""


@pytest.fixture(scope="module")
def run_script():
    """``run(script, cwd) -> (exit code, stdout, stderr)``: the script in a process of its own with the blocks'
    environment (no ``PYTHONPATH``, one thread, W&B offline), forked from ``block_runner.py`` (torch and taskfit
    imported once for all blocks) where ``os.fork`` exists, else a fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("PYTHONPATH", None)
    server = None
    if hasattr(os, "fork"):
        server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("block_runner.py"))], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(script: Path, cwd: Path) -> tuple[int, str, str]:
        if server is None:
            proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=600)
            return proc.returncode, proc.stdout, proc.stderr
        out, err = cwd / "block.stdout", cwd / "block.stderr"
        server.stdin.write(json.dumps({"script": str(script), "cwd": str(cwd), "stdout": str(out),
                                       "stderr": str(err)}) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, f"block_runner.py ended (exit code {server.poll()})"
        return json.loads(reply)["rc"], out.read_text(), err.read_text()

    yield run
    if server is not None:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a block that never ended (its test failed on its timeout)
            server.kill()
            server.wait()


@pytest.mark.parametrize("name,code", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_F_OBS_7_python_block_runs(name, code, tmp_path, run_script):
    """Each block exits 0; the README's quick start (F-REPRO-1) also prints the same results (training loss,
    validation accuracy, prediction shape) and saves the same weights, byte for byte, when run twice in one
    interpreter: its model is built after ``Fit(...)``, which seeds as HF's ``Trainer.__init__`` does."""
    script = tmp_path / "block.py"
    script.write_text(code)
    (tmp_path / "twice.py").write_text(_TWICE)
    rc, stdout, stderr = run_script(tmp_path / ("twice.py" if name == QUICK_START else "block.py"), tmp_path)
    assert rc == 0, f"{name} failed:\n{code}\n--- stderr ---\n{stderr[-4000:]}"
    if name == QUICK_START:
        first, second, rest = stdout.split("=== end of run\n")  # each ends with the script's print
        assert not rest and first.splitlines()[-1] == second.splitlines()[-1], stdout[-2000:]
        weights = [(tmp_path / folder / "runs" / "demo" / "final" / "model.safetensors").read_bytes()
                   for folder in ("first", "second")]
        assert weights[0] == weights[1]


def test_F_OBS_7_docs_exist_and_blocks_found():
    names = {p.name for p in DOCS}
    for page in ("quickstart.md", "checkpoints.md", "strategies.md", "cli.md", "logging.md", "lightning.md", "hf.md",
                 "engine.md", "accelerators.md", "publishing.md", "tuning.md", "examples.md", "testing.md",
                 "architecture.md", "migrating-from-lightning.md", "migrating-from-hf-trainer.md"):
        assert page in names, page
    assert len([n for n, _ in BLOCKS if n.startswith("README.md")]) >= 3


@pytest.mark.parametrize("doc", DOCS + [ROOT / "benchmarks" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_F_OBS_7_user_docs_name_no_internal_ids_or_outside_files(doc):
    text = doc.read_text()
    assert not re.findall(r"\bF-[A-Z]+-\d", text), "internal feature IDs in user-facing text"
    assert "../shared" not in text and "DATA.md" not in text
    for link in re.findall(r"\]\(([^)#]+)\)", text):  # relative links point inside the repository
        if "://" not in link:
            assert (doc.parent / link).exists(), link


def test_F_OBS_7_examples_docstrings_name_no_internal_ids():
    for path in sorted((ROOT / "examples").glob("*.py")):
        head = path.read_text().split('"""')[1]
        assert not re.findall(r"\bF-[A-Z]+-\d", head) and "DATA.md" not in head, path.name


_DIFF = re.compile(r"^```diff[^\n]*\n(.*?)^```", re.S | re.M)


def test_F_OBS_7_import_swap_diff_blocks_import():
    """Each ``diff`` block shows an import swap: its ``+`` lines (taskfit's side) run as written, in one
    interpreter (imports only, so no process of their own is needed)."""
    swaps = [(doc.name, m.group(1)) for doc in DOCS for m in _DIFF.finditer(doc.read_text())]
    assert any(name == "README.md" for name, _ in swaps)
    for name, block in swaps:
        added = "\n".join(line[1:] for line in block.splitlines() if line.startswith("+"))
        assert "taskfit" in added, (name, block)
        exec(compile(added, f"{name} diff block", "exec"), {})  # noqa: S102  (our own docs' import lines)
