"""The GPU proof kit itself (issue 29, docs/gpu.md): its CPU dry run goes end to end, so a broken kit is found
before a GPU machine is lent. ``bash tests/gpu/run.sh OUT --device cpu --dry-run`` with this interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("env", "pytest", "matrix", "dist", "checks", "perf")


@pytest.mark.slow  # about 55 s of CPU: run before a GPU loan (`make test-slow`), not in every `make test`
def test_gpu_kit_dry_run_writes_every_part_and_no_row_fails(tmp_path):
    """Every part's JSON and Markdown exist, no part timed out, every row passes or is skipped with a reason (the
    CUDA-only rows), and the matrix's rows that run on a CPU all pass against the fp32 reference."""
    out = tmp_path / "kit"
    proc = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "run.sh"), str(out), "--device", "cpu", "--dry-run"],
                          cwd=REPO, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, check=False,
                          timeout=1500)
    assert (out / "SUMMARY.md").exists() and (out / "command.txt").exists(), proc.stdout[-3000:]
    parts = (out / "parts.txt").read_text()
    assert "rc=124" not in parts and "rc=0" in parts, parts
    for part in PARTS:
        data = json.loads((out / f"{part}.json").read_text())
        assert (out / f"{part}.md").exists() and data["dry_run"] and data["rows"], part
        failed = [(r["name"], r.get("reason")) for r in data["rows"] if r["status"] == "fail"]
        assert not failed, (part, failed)
        assert all(r.get("reason") for r in data["rows"] if r["status"] == "skip"), part
    matrix = {r["name"]: r for r in json.loads((out / "matrix.json").read_text())["rows"]}
    for name in ("32-true (reference)", "bf16-mixed", "16-mixed", "bf16-true", "fused AdamW", "gradient checkpointing",
                 "eager attention vs SDPA", "taskfit.hf.Trainer"):
        assert matrix[name]["status"] == "pass", matrix[name]
    assert matrix["16-mixed"]["skipped_steps"] == 0 and matrix["16-mixed"]["loss_scale"] > 1
    perf = {r["name"]: r for r in json.loads((out / "perf.json").read_text())["rows"]}
    assert perf["tiny MLP: taskfit"]["us_per_step"] > 0 and perf["GPT-2 from config: raw"]["tokens_per_s"] > 0
    assert proc.returncode == 0, proc.stdout[-3000:]
