"""Every Strategy and Accelerator interface method is called in a real run (issue 13, item 6): a single-process
run and a 2-process DDP run (gloo) of ``interface_job.py`` wrap each public method of ``Strategy`` and
``Accelerator`` (on the base class and every override), record the calls per rank, and each method of the
interface, as found on the classes when the test runs, must appear. A method that a CPU run cannot reach is
exempt with its reason. The contract's lifecycle methods (teardown in a ``finally``, checkpoints through the
strategy, rank 0's resume choice broadcast) are among the required calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskfit.accelerators.accelerator import Accelerator
from taskfit.strategies.strategy import Strategy

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from interface_job import public_methods  # noqa: E402

#: the contract methods of the foundation refactor (each is also required like every other method)
CONTRACT = {"Strategy.teardown", "Strategy.save_checkpoint", "Strategy.load_checkpoint", "Strategy.broadcast",
            "Accelerator.teardown", "Accelerator.empty_cache"}
#: (mode, method) -> why a real CPU run of that mode does not call it
EXEMPT = {
    ("single", "Strategy.all_gather"): "one process: evaluation gathers nothing (identity collective skipped)",
    ("single", "Strategy.broadcast"): "one process: nothing to agree on",
    ("single", "Strategy.check_collective"): "one process: the graceful-stop flag is not all-reduced",
    ("ddp", "Accelerator.auto_device_count"): "devices=2 is explicit; only devices='auto' counts devices",
    ("single", "Accelerator.set_tf32"): "tf32 applies to CUDA only (the CPU refusal has its own test)",
    ("ddp", "Accelerator.set_tf32"): "tf32 applies to CUDA only (the CPU refusal has its own test)",
    ("single", "Accelerator.supports_tf32"): "asked by the CUDA accelerator's set_tf32 only",
    ("ddp", "Accelerator.supports_tf32"): "asked by the CUDA accelerator's set_tf32 only",
    ("single", "Strategy.adapter_state_dict"): "a PEFT model under FSDP/DeepSpeed (tests/finetune/test_lora_sharded)",
    ("ddp", "Strategy.adapter_state_dict"): "a PEFT model under FSDP/DeepSpeed (tests/finetune/test_lora_sharded)",
}
MODES = {"single": {}, "ddp": {"devices": 2, "strategy": "ddp"}}


def interface() -> list[str]:
    return [f"Strategy.{m}" for m in public_methods(Strategy)] + [f"Accelerator.{m}" for m in
                                                                  public_methods(Accelerator)]


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    """``{mode: [set of calls per rank]}``, each mode run once in fresh processes."""
    cache: dict[str, list[set[str]]] = {}

    def get(mode: str) -> list[set[str]]:
        if mode not in cache:
            out = tmp_path_factory.mktemp(f"interface-{mode}")
            cfg = out / "cfg.json"
            cfg.write_text(json.dumps({"out": str(out), **MODES[mode]}))
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                  "MASTER_PORT", "TASKFIT_LAUNCHED")}
            proc = subprocess.run([sys.executable, str(HERE / "interface_job.py"), str(cfg)], cwd=HERE,
                                  env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            ranks = 2 if mode == "ddp" else 1
            cache[mode] = [set(json.loads((out / f"calls_{r}.json").read_text())) for r in range(ranks)]
        return cache[mode]

    return get


def _cases():
    for mode in MODES:
        for method in interface():
            if (mode, method) in EXEMPT:
                continue
            marks = [pytest.mark.distributed] if mode == "ddp" else []
            yield pytest.param(mode, method, marks=marks, id=f"{mode}-{method}")


@pytest.mark.parametrize("mode, method", list(_cases()))
def test_interface_method_is_called_in_a_real_run(calls, mode, method):
    per_rank = calls(mode)
    missing = [rank for rank, called in enumerate(per_rank) if method not in called]
    assert not missing, f"{method} was not called on rank(s) {missing} of the {mode} run"


def test_exemptions_name_interface_methods():
    """The exemption and contract lists name methods that exist (a renamed method must not hide here)."""
    names = set(interface())
    assert {m for _, m in EXEMPT} <= names and CONTRACT <= names
