"""Zero host syncs per optimizer step (issue 13, item 6; DESIGN.md hot path): in the default single-process and
DDP loops, a step that neither logs, evaluates nor saves converts no tensor to a host value (``.item()``,
``float()``, ``int()``, ``bool()``, ``.tolist()``, ``.numpy()``), in its body or after it. Real runs of
``sync_job.py`` (12 steps, logging / evaluation / saving every 5) count the conversions per step and phase.

Left out of the count: conversions inside ``torch/optim/`` (the optimizers read their step counter, a CPU tensor
unless ``capturable``, with ``.item()``: no device is waited for), the graceful-stop flag under DDP
(``taskfit/signals.py``: a CPU tensor of a gloo group, all-reduced one step earlier, so reading it waits for no
device), the fit loop's record of a CPU loss (the statement :data:`HOST_LOSS_RECORD`: taken only when the running
loss sum lives on the CPU, a loss on any other device is added there as a tensor, so it never waits for a device)
and the first step (the epoch's sampler order is drawn when the epoch starts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MODES = {
    "single": {},
    "single-accumulation": {"accum": 3},
    "ddp-accumulation": {"devices": 2, "strategy": "ddp", "accum": 2},
}


def _run(tmp_path: Path, cfg: dict) -> list[dict]:
    (tmp_path / "cfg.json").write_text(json.dumps({"out": str(tmp_path), **cfg}))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    proc = subprocess.run([sys.executable, str(HERE / "sync_job.py"), str(tmp_path / "cfg.json")], cwd=HERE,
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"syncs_{r}.json").read_text()) for r in range(cfg.get("devices", 1))]


def _ours(calls: list[str]) -> list[str]:
    return [c for c in calls if "torch/optim/" not in c and "/signals.py:" not in c]


@pytest.mark.parametrize("mode", [pytest.param(m, marks=[pytest.mark.distributed] if "ddp" in m else [])
                                  for m in MODES])
def test_no_host_sync_on_steps_that_neither_log_evaluate_nor_save(tmp_path, mode):
    for rank, rec in enumerate(_run(tmp_path, MODES[mode])):
        busy = set(rec["logged"]) | set(rec["evaluated"]) | set(rec["saved"])
        assert busy == {5, 10, 12}, rec  # the run did log, evaluate and save where configured
        quiet = [s for s in range(2, 12) if s not in busy]
        syncs = {(phase, s): _ours(rec[phase].get(str(s), [])) for phase in ("body", "after") for s in quiet}
        syncs = {k: v for k, v in syncs.items() if v}
        assert not syncs, f"rank {rank}: host syncs on steps that neither log, evaluate nor save: {syncs}"
        # the instrumentation sees conversions where they are expected: the logging / evaluation steps
        assert _ours(rec["after"]["5"]) and _ours(rec["after"]["10"]), rec["after"]
