"""The GPU proof kit's driver: ``python tests/gpu/kit.py PART [PART ...] --device cuda|cpu --out DIR [--dry-run]``.

Parts (on the GPU ``tests/gpu/run.sh`` runs each in its own process under its own ``timeout``; the CPU dry run
runs ``env matrix checks perf dist`` in one process, one interpreter start instead of five): ``env`` (device,
versions), ``pytest`` (turns the junit XML of ``pytest -m cuda`` into rows), ``matrix`` (single-device
correctness rows, each against the fp32 run of the same job), ``dist`` (DDP, FSDP2, DeepSpeed ZeRO-2/3 with
``devices=1``), ``checks`` (exact resume after SIGKILL, ``DeviceStatsMonitor``, async checkpoint blocking time)
and ``perf`` (taskfit against a hand-written loop, Lightning and the HF Trainer). Every part writes
``DIR/<part>.json`` and ``DIR/<part>.md`` after each row, so a part stopped by its time limit leaves the rows it
finished. ``--dry-run`` uses tiny sizes so the whole kit runs on a CPU in about a minute (the test
``tests/gpu/test_gpu_kit.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for _p in (HERE, REPO):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: job sizes per mode: the GPU run and the CPU dry run (same code, smaller numbers)
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {"vocab": 512, "seq": 128, "hidden": 256, "layers": 4, "heads": 4, "batch": 16, "steps": 30,
            "mlp_steps": 400, "mlp_reps": 3, "lm": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab": 50257,
                                                      "seq": 1024, "batch": 8, "steps": 14, "warmup": 4},
            "ckpt_hidden": 4096, "ckpt_layers": 4},
    "dry": {"vocab": 64, "seq": 16, "hidden": 32, "layers": 2, "heads": 2, "batch": 4, "steps": 6,
            "mlp_steps": 30, "mlp_reps": 1, "lm": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab": 128,
                                                     "seq": 16, "batch": 2, "steps": 6, "warmup": 2},
            "ckpt_hidden": 64, "ckpt_layers": 2},
}


class Skip(Exception):
    """A row that cannot run here (missing hardware or package); the message says why."""


class Report:
    """The rows of one part, rewritten to ``out/<part>.json`` and ``out/<part>.md`` after every row.

    Args:
        part (str): the part's name (file stem). out (str): the results folder. device (str): ``cuda`` or ``cpu``.
    """

    def __init__(self, part: str, out: str, device: str, dry_run: bool) -> None:
        self.part, self.out = part, out
        self.data: dict[str, Any] = {"part": part, "device": device, "dry_run": dry_run, "rows": [],
                                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.makedirs(out, exist_ok=True)
        self._t0 = time.perf_counter()

    def run(self, name: str, fn: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one row: ``fn(*args, **kwargs)`` returns its values with ``status`` ``pass``/``fail``; :class:`Skip` skips it
        and any other exception fails it with the error; the files are rewritten either way."""
        start = time.perf_counter()
        try:
            row = {"name": name, **fn(*args, **kwargs)}
        except Skip as why:
            row = {"name": name, "status": "skip", "reason": str(why)}
        except Exception as err:  # noqa: BLE001  (a failing row is a result; the other rows still run)
            tail = traceback.format_exc().strip().splitlines()[-6:]
            row = {"name": name, "status": "fail", "reason": f"{type(err).__name__}: {err}"[:400], "trace": tail}
        row["seconds"] = round(time.perf_counter() - start, 2)
        self.data["rows"].append(row)
        self.write()
        print(f"[{self.part}] {name}: {row['status']} ({row['seconds']} s) {row.get('reason', '')}"[:300], flush=True)
        return row

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self._t0, 2)
        with open(os.path.join(self.out, f"{self.part}.json"), "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        with open(os.path.join(self.out, f"{self.part}.md"), "w") as f:
            f.write(markdown(self.data))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/").replace("\n", " ")[:160]


def markdown(data: dict[str, Any]) -> str:
    """One table per part: name, status, seconds, then every other value as ``key=value``."""
    lines = [f"## {data['part']} ({data['device']}{', dry run' if data['dry_run'] else ''})", "",
             "| row | status | s | values |", "|---|---|---|---|"]
    for row in data["rows"]:
        extra = ", ".join(f"{k}={_cell(v)}" for k, v in row.items() if k not in ("name", "status", "seconds", "trace"))
        lines.append(f"| {row['name']} | {row['status']} | {row['seconds']} | {extra} |")
    return "\n".join(lines) + "\n"


def compare(loss: float, ref: float, rtol: float, **values: Any) -> dict[str, Any]:
    """A ``match`` row: pass when ``|loss - ref| <= rtol * |ref|`` (losses are mean cross-entropies, nats)."""
    rel = abs(loss - ref) / max(abs(ref), 1e-12)
    return {"status": "pass" if rel <= rtol else "fail", "loss": loss, "ref_loss": ref, "rel_diff": rel,
            "rtol": rtol, **values}


def env_part(report: Report, device: str) -> None:
    """Device, driver and package versions, as one row."""
    import importlib.metadata as md

    import torch

    def info() -> dict[str, Any]:
        out: dict[str, Any] = {"status": "pass", "python": platform.python_version(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "cpus": os.cpu_count()}
        for dist in ("taskfit", "transformers", "accelerate", "lightning", "peft", "deepspeed", "bitsandbytes",
                     "torchao", "triton", "nvidia-ml-py"):
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                out[dist] = None
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            out.update(gpu=props.name, gpu_memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}",
                       bf16=torch.cuda.is_bf16_supported(), nccl=".".join(map(str, torch.cuda.nccl.version())))
        return out

    report.run("environment", info)


def pytest_part(report: Report, junit: str) -> None:
    """One row per test case of the junit XML written by ``pytest -m cuda``."""
    import xml.etree.ElementTree as ET

    if not os.path.exists(junit):
        report.run("pytest -m cuda", lambda: {"status": "fail", "reason": f"{junit} missing (pytest did not finish)"})
        return
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"

        def row(case: Any = case) -> dict[str, Any]:
            for tag, status in (("failure", "fail"), ("error", "fail"), ("skipped", "skip")):
                node = case.find(tag)
                if node is not None:
                    return {"status": status, "reason": (node.get("message") or "")[:300]}
            return {"status": "pass"}

        report.run(name, row)


def run_one(part: str, device: str, out: str, dry_run: bool, junit: str | None = None) -> None:
    """Run part ``part`` into ``out/<part>.json`` and ``.md`` (the row functions of its module)."""
    report = Report(part, out, device, dry_run)
    sizes = SIZES["dry" if dry_run else "gpu"]
    if part == "env":
        env_part(report, device)
    elif part == "pytest":
        pytest_part(report, junit or "")
    else:
        import importlib

        module = importlib.import_module({"matrix": "matrix", "dist": "dist_rows", "checks": "checks",
                                          "perf": "perf"}[part])
        module.run_part(report, device, sizes)
    report.write()


def main(argv: list[str] | None = None) -> int:
    """``kit.py PART [PART ...]``: several parts run one after another in this process (the CPU dry run does so,
    saving an interpreter with torch and transformers per part); each still writes its own files."""
    p = argparse.ArgumentParser(prog="python tests/gpu/kit.py")
    p.add_argument("part", nargs="+", choices=("env", "pytest", "matrix", "dist", "checks", "perf"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--out", required=True)
    p.add_argument("--dry-run", action="store_true", help="tiny sizes (a CPU run of the whole kit)")
    p.add_argument("--junit", help="pytest part: the junit XML to read")
    ns = p.parse_args(argv)
    for part in ns.part:
        run_one(part, ns.device, ns.out, ns.dry_run, ns.junit)
    return 0


if __name__ == "__main__":
    import kit  # the rows import ``kit``: run its copy, so that ``kit.Skip`` is the class they raise

    sys.exit(kit.main())
