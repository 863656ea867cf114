"""Strategies suite (F-BENCH-3): the same job under single device, DDP, FSDP (each sharding strategy) and
DeepSpeed stages 1-3 (and offload) with 2 processes: throughput (samples/s over all ranks), peak RSS per rank
(bytes), checkpoint size (bytes), save time (seconds, from the last step's ``on_step_end`` to ``on_save``) and
load time (seconds to read and deserialise every file of the checkpoint folder).

The job: a ReLU MLP 784-2048-2048-10 (5.8 M parameters) on synthetic data, per-device batch 64, AdamW (the
arguments' default optimizer), fp32, one checkpoint at the last step. Each row runs in one fresh worker
process that calls ``Fit(strategy=..., devices=...)``; the strategy starts its other ranks itself (F-STRAT-7).
Rows whose strategy is not built yet (registry entry still ``pending``) or whose package (deepspeed) is
missing are skipped with the reason.
"""

from __future__ import annotations

import os
import time
from typing import Any

from taskfit import Callback

from benchmarks.common import (
    default_out_dir,
    finish,
    fmt_bytes,
    log,
    machine_info,
    machine_label,
    md_note,
    md_table,
    package_version,
    peak_rss_bytes,
    run_worker,
    select_rows,
)

SIZES = (784, 2048, 2048, 10)
BATCH = 64
STEPS, WARMUP = 30, 5
QUICK_STEPS, QUICK_WARMUP = 6, 2
#: (row name, strategy name, devices, extra FitArguments, required distribution)
ROWS: list[tuple[str, str, int, dict[str, Any], str | None]] = [
    ("single_device", "single_device", 1, {}, None),
    ("ddp", "ddp", 2, {}, None),
    ("ddp_spawn", "ddp_spawn", 2, {}, None),
    ("fsdp_full_shard", "fsdp", 2, {"fsdp": "full_shard"}, None),
    ("fsdp_shard_grad_op", "fsdp", 2, {"fsdp": "shard_grad_op"}, None),
    ("fsdp_no_shard", "fsdp", 2, {"fsdp": "no_shard"}, None),
    ("fsdp_hybrid_shard", "fsdp", 2, {"fsdp": "hybrid_shard"}, None),
    ("fsdp_full_shard_offload", "fsdp", 2, {"fsdp": "full_shard offload"}, None),
    ("deepspeed_stage_1", "deepspeed_stage_1", 2, {}, "deepspeed"),
    ("deepspeed_stage_2", "deepspeed_stage_2", 2, {}, "deepspeed"),
    ("deepspeed_stage_2_offload", "deepspeed_stage_2_offload", 2, {}, "deepspeed"),
    ("deepspeed_stage_3", "deepspeed_stage_3", 2, {}, "deepspeed"),
    ("deepspeed_stage_3_offload", "deepspeed_stage_3_offload", 2, {}, "deepspeed"),
]


def precheck(row: tuple) -> str | None:
    """Why ``row`` cannot run here (None when it can): strategy pending, package missing, option pending."""
    _, strategy, devices, extra, need = row
    from taskfit import FitArguments
    from taskfit.strategies import STRATEGIES

    if strategy not in STRATEGIES:
        return f"strategy {strategy!r} is not registered"
    if STRATEGIES.get(strategy).pending:
        return f"{strategy!r}: {STRATEGIES.get(strategy).pending}"
    if need and package_version(need) is None:
        return f"{need} is not installed"
    try:
        FitArguments(output_dir="unused", strategy=strategy, devices=devices, **extra).check_implemented()
    except (NotImplementedError, ValueError) as err:
        return str(err)
    return None


class Report(Callback):
    """At ``on_train_end`` (every rank, process group alive): all-gather each rank's peak RSS (bytes), mean
    step time after the warm-up (s) and last save time (s); rank 0 then measures the checkpoint and writes the
    row's result JSON to ``out``. Module level, so spawn-started ranks can unpickle it."""

    def __init__(self, clock: Any, warmup: int, out: str, out_dir: str, started: float) -> None:
        self.clock, self.warmup, self.out, self.out_dir, self.started = clock, warmup, out, out_dir, started

    def on_train_end(self, fit: Any, module: Any) -> None:
        import json

        import torch

        from benchmarks.fitjobs import newest_checkpoint, read_folder

        stamps = self.clock.steps[self.warmup - 1 :]
        step_s = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        save_s = self.clock.saves[-1][1] if self.clock.saves else float("nan")
        mine = torch.tensor([float(peak_rss_bytes()), step_s, save_s], dtype=torch.float64)
        per_rank = fit.strategy.all_gather(mine).reshape(-1, 3).tolist()
        if fit.global_rank != 0:
            return
        step_s = max(r[1] for r in per_rank)  # the slowest rank sets the pace
        ckpt = newest_checkpoint(self.out_dir)
        load_s, size = read_folder(ckpt) if ckpt else (None, None)
        world = fit.world_size
        result = {
            "strategy": fit.args.strategy,
            "world_size": world,
            "samples_per_s": BATCH * world / step_s,
            "step_s": step_s,
            "call_s": time.perf_counter() - self.started,
            "peak_rss_bytes_per_rank": [int(r[0]) for r in per_rank],
            "save_s": max(r[2] for r in per_rank),
            "checkpoint_bytes": size,
            "load_s": load_s,
            "checkpoint": os.path.basename(ckpt or ""),
        }
        with open(self.out, "w") as f:
            json.dump(result, f)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one row; every rank runs this (or, under a spawn launcher, the ranks run ``Fit``'s part of it).
    Rank 0 writes the result from :class:`Report`, so this returns ``{"_discard": True}``."""
    import torch
    from taskfit import Fit, FitArguments

    from benchmarks.fitjobs import mlp_task, step_clock, synthetic_data

    torch.set_num_threads(spec["threads"])
    _, strategy, devices, extra, _ = next(r for r in ROWS if r[0] == spec["row"])
    total = spec["steps"] + spec["warmup"]
    out_dir = os.path.join(spec["tmp"], "run")
    args = FitArguments(
        output_dir=out_dir,
        max_steps=total,
        per_device_train_batch_size=BATCH,
        seed=0,
        logging_strategy="no",
        save_strategy="steps",
        save_steps=total,
        report_to="none",
        disable_tqdm=True,
        strategy=strategy,
        devices=devices,
        accelerator="cpu",
        **extra,
    )
    data = synthetic_data(BATCH * devices * total, SIZES[0], SIZES[-1])
    clock = step_clock()
    report = Report(clock, spec["warmup"], spec["out"], out_dir, time.perf_counter())
    Fit(args, callbacks=[clock, report]).fit(mlp_task(SIZES), data)
    return {"_discard": True}


def run_suite(
    *,
    quick: bool = False,
    out_dir: str | None = None,
    reps: int | None = None,
    device: str = "cpu",
    threads: int = 1,
    only: list[str] | None = None,
) -> int:
    """Run the strategies suite; write ``results.json``, ``results.md``, ``strategies.png``; print the table.

    Args:
        quick: fewer steps. out_dir: results folder. reps: unused. device: only ``"cpu"`` rows run on gloo
        here. threads: ``torch.set_num_threads`` per rank. only: row names (ValueError lists valid ones).

    Returns:
        0.
    """
    rows = select_rows("strategy", ROWS, only)
    info = machine_info(threads, device)
    log(f"strategies: {len(rows)} rows ({machine_label(info)})")
    steps, warmup = (QUICK_STEPS, QUICK_WARMUP) if quick else (STEPS, WARMUP)
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for row in rows:
        reason = precheck(row)
        if reason:
            results[row[0]] = {"skipped": reason}
            log(f"  skipped {row[0]}: {reason}")
            continue
        res = run_worker(
            "strategies", {"row": row[0], "steps": steps, "warmup": warmup, "device": device}, threads=threads
        )
        results[row[0]] = res
        log(
            f"  {row[0]:26s} "
            + (
                f"{res['samples_per_s']:8.1f} samples/s"
                if "samples_per_s" in res
                else str(res.get("skipped") or res.get("error"))[:300]
            )
        )
    data = {
        "machine": info,
        "settings": {
            "steps": steps,
            "warmup": warmup,
            "batch_per_device": BATCH,
            "model": f"MLP {'-'.join(map(str, SIZES))}",
            "threads": threads,
        },
        "rows": {r[0]: {"strategy": r[1], "devices": r[2], "extra": r[3], **results[r[0]]} for r in rows},
        "elapsed_s": time.perf_counter() - started,
    }
    finish(
        "strategies", data, markdown(data), out_dir or default_out_dir("strategies", device, quick), _chart
    )
    return 0


def markdown(data: dict) -> str:
    """One line per strategy row."""
    s = data["settings"]
    lines = [
        "### Strategies on one job",
        "",
        (
            f"{machine_label(data['machine'])}; {s['model']}, batch {s['batch_per_device']} per device, AdamW, "
            f"fp32, {s['steps']} steps timed after {s['warmup']} warm-up steps, one checkpoint at the end. "
            "Load = reading and deserialising every file of the checkpoint folder."
        ),
        "",
    ]
    rows = []
    for name, r in data["rows"].items():
        if "samples_per_s" in r:
            rss = ", ".join(fmt_bytes(b) for b in r["peak_rss_bytes_per_rank"])
            rows.append(
                [
                    name,
                    r["devices"],
                    f"{r['samples_per_s']:.0f}",
                    rss,
                    fmt_bytes(r["checkpoint_bytes"]),
                    f"{r['save_s']:.3f}",
                    f"{r['load_s']:.3f}" if r["load_s"] is not None else "-",
                    "",
                ]
            )
        else:
            why = (
                "skipped: " + md_note(r["skipped"])
                if "skipped" in r
                else "failed: " + md_note(r.get("error"))
            )
            rows.append([name, r["devices"], "-", "-", "-", "-", "-", why])
    lines.append(
        md_table(
            [
                "strategy",
                "processes",
                "samples/s (all ranks)",
                "peak RSS per rank",
                "checkpoint size",
                "save s",
                "load s",
                "note",
            ],
            rows,
        )
    )
    return "\n".join(lines) + "\n"


def _chart(data: dict, out: str) -> None:
    from benchmarks.plots import grouped_bars

    done = {n: r for n, r in data["rows"].items() if "samples_per_s" in r}
    if not done:
        return
    grouped_bars(
        os.path.join(out, "strategies.png"),
        list(done),
        {"samples/s (all ranks)": [r["samples_per_s"] for r in done.values()]},
        ylabel="samples/s",
        title="Throughput per strategy (same job)",
        subtitle=machine_label(data["machine"]),
    )
    grouped_bars(
        os.path.join(out, "strategies_memory.png"),
        list(done),
        {
            "peak RSS per rank, MiB": [max(r["peak_rss_bytes_per_rank"]) / 2**20 for r in done.values()],
            "checkpoint, MiB": [(r["checkpoint_bytes"] or 0) / 2**20 for r in done.values()],
        },
        ylabel="MiB",
        title="Peak memory per rank and checkpoint size",
        subtitle=machine_label(data["machine"]),
    )
