"""Strategies suite (F-BENCH-3): the same job under single device, DDP, FSDP (each sharding strategy),
DeepSpeed stages 1-3 (and offload) and model parallel (tensor parallel) with 2 processes, each next to the same
job written by hand in plain PyTorch / DeepSpeed (:mod:`benchmarks.raw_loops`): a DDP loop, an FSDP2
``fully_shard`` loop, a bare ``deepspeed.initialize`` engine loop, a bare DTensor tensor-parallel loop.

Per row and repetition the taskfit run and the raw run alternate (taskfit, raw, taskfit, raw, ...: ABAB), each
in fresh processes; the per-step time of a run is the median interval between consecutive optimizer steps after
the warm-up on its slowest rank; the ratio taskfit/raw is taken per repetition and its median reported. Also:
throughput (samples/s over the data-parallel ranks), peak RSS per rank (bytes), checkpoint size (bytes), save
time (seconds, from the last step's ``on_step_end`` to ``on_save``) and load time (seconds to read and
deserialise every file of the checkpoint folder) of the taskfit run; the machine's load average before and
after the suite.

The job: a ReLU MLP 784-2048-2048-10 (5.8 M parameters) on synthetic data, per-device batch 64, AdamW (the
arguments' defaults), constant learning rate, no clipping, fp32, one checkpoint at the last step (taskfit
only). A taskfit run is one fresh worker process that calls ``Fit(strategy=..., devices=...)``, which starts the
other ranks itself (F-STRAT-7); a raw run's first process starts the other ranks with the ``env://`` variables.
Rows whose strategy is not registered or built yet, or whose package (deepspeed) is missing, are skipped with
the reason (``model_parallel`` prints "not available" until that strategy is registered).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from taskfit import Callback

from benchmarks.common import (
    NOT_COMPARABLE,
    compare_ratio,
    default_out_dir,
    finish,
    fmt_bytes,
    fmt_load,
    fmt_range,
    log,
    machine_info,
    machine_label,
    machine_load,
    md_note,
    md_table,
    package_version,
    peak_rss_bytes,
    run_worker,
    select_rows,
    step_times,
    summary,
)
from benchmarks.fitjobs import MLPClassifier

SIZES = (784, 2048, 2048, 10)
BATCH = 64
STEPS, WARMUP, REPS = 50, 5, 3
QUICK_STEPS, QUICK_WARMUP, QUICK_REPS = 6, 2, 1
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
    ("model_parallel", "model_parallel", 2, {}, None),
]
#: measured first (the table keeps ROWS order): the row the committed table showed failing
FIRST = ("single_device", "deepspeed_stage_2_offload")
#: rows whose processes all see the same batches (tensor parallel only: the data-parallel size is 1)
SAME_DATA_ROWS = ("model_parallel",)


def raw_counterpart(row: str) -> tuple[str, str, dict[str, Any]]:
    """``(label, raw_loops kind, options)`` of the hand-written loop that does row ``row``'s job.

    Raises:
        ValueError: an unknown row (names the valid ones).
    """
    from benchmarks.raw_loops import RAW_KINDS

    if row == "single_device":
        kind, options = "single_device", {}
    elif row in ("ddp", "ddp_spawn"):
        kind, options = "ddp", {}
    elif row.startswith("fsdp_"):
        sharding = row[len("fsdp_"):].removesuffix("_offload")
        kind, options = "fsdp", {"sharding": sharding, "offload": row.endswith("_offload")}
    elif row.startswith("deepspeed_stage_"):
        stage = int(row[len("deepspeed_stage_")])
        kind, options = "deepspeed", {"stage": stage, "offload_optimizer": row.endswith("_offload"),
                                      "offload_param": stage == 3 and row.endswith("_offload")}
    elif row == "model_parallel":
        kind, options = "tensor_parallel", {}
    else:
        raise ValueError(f"unknown strategies row {row!r}; valid: {', '.join(r[0] for r in ROWS)}")
    return RAW_KINDS[kind], kind, options


class TPClassifier(MLPClassifier):
    """:class:`MLPClassifier` whose ``configure_model`` applies the raw loop's tensor-parallel plan
    (:func:`benchmarks.raw_loops.tp_plan`) on ``self.device_mesh["tensor_parallel"]`` (Lightning's
    ``ModelParallelStrategy`` contract)."""

    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        from benchmarks.raw_loops import tp_plan

        parallelize_module(self.net, self.device_mesh["tensor_parallel"], tp_plan(self.net))


def fit_arguments(out_dir: str, total: int, batch: int, strategy: str, devices: int, extra: dict[str, Any],
                  save: bool = True) -> Any:
    """The ``FitArguments`` of a taskfit row: the raw loops' job (constant LR, no clipping, fp32, seed 0), one
    checkpoint at the last step when ``save``."""
    from taskfit import FitArguments

    return FitArguments(
        output_dir=out_dir,
        max_steps=total,
        per_device_train_batch_size=batch,
        seed=0,
        lr_scheduler_type="constant",
        optim="adamw_torch",  # the raw loops' torch.optim.AdamW (not the fused default): same optimizer code
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="steps" if save else "no",
        save_steps=total,
        report_to="none",
        disable_tqdm=True,
        strategy=strategy,
        devices=devices,
        accelerator="cpu",
        **extra,
    )


def precheck(row: tuple) -> str | None:
    """Why ``row`` cannot run here (None when it can): strategy not registered or pending, package missing,
    option pending."""
    _, strategy, devices, extra, need = row
    from taskfit import FitArguments
    from taskfit.strategies import STRATEGIES

    if strategy not in STRATEGIES:
        return f"not available (strategy {strategy!r} is not registered)"
    if STRATEGIES.get(strategy).pending:
        return f"{strategy!r}: {STRATEGIES.get(strategy).pending}"
    if need and package_version(need) is None:
        return f"{need} is not installed"
    try:
        FitArguments(output_dir="unused", strategy=strategy, devices=devices, **extra)
    except ValueError as err:
        return str(err)
    return None


def _per_step(stamps: list[float], warmup: int) -> float:
    """Median seconds between consecutive optimizer steps after ``warmup`` steps."""
    return statistics.median(step_times(stamps, warmup - 1 if warmup else 0))


class CPUClock(Callback):
    """Records ``time.process_time()`` (CPU seconds of every thread of the process) at every ``on_step_end``:
    unlike the wall clock, it does not grow when other jobs take the cores, so on a loaded machine the CPU
    time per step still compares the work taskfit and the raw loop do."""

    def __init__(self) -> None:
        self.steps: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(time.process_time())


class Report(Callback):
    """At ``on_train_end`` (every rank, process group alive): all-gather each rank's peak RSS (bytes), median
    step time after the warm-up (s) and last save time (s); rank 0 then measures the checkpoint and writes the
    row's result JSON to ``out``. Module level, so spawn-started ranks can unpickle it."""

    def __init__(self, clock: Any, warmup: int, out: str, out_dir: str, started: float, replicas: int,
                 cpu: CPUClock | None = None) -> None:
        self.clock, self.warmup, self.out, self.out_dir, self.started = clock, warmup, out, out_dir, started
        self.replicas, self.cpu = replicas, cpu

    def on_train_end(self, fit: Any, module: Any) -> None:
        import torch

        from benchmarks.fitjobs import newest_checkpoint, read_folder

        save_s = self.clock.saves[-1][1] if self.clock.saves else float("nan")
        cpu_s = _per_step(self.cpu.steps, self.warmup) if self.cpu is not None else float("nan")
        mine = torch.tensor([float(peak_rss_bytes()), _per_step(self.clock.steps, self.warmup), save_s, cpu_s],
                            dtype=torch.float64)
        per_rank = fit.strategy.all_gather(mine).reshape(-1, 4).tolist()
        if fit.global_rank != 0:
            return
        step_s = max(r[1] for r in per_rank)  # the slowest rank sets the pace
        ckpt = newest_checkpoint(self.out_dir)
        load_s, size = read_folder(ckpt) if ckpt else (None, None)
        result = {
            "strategy": fit.args.strategy,
            "world_size": fit.world_size,
            "samples_per_s": BATCH * self.replicas / step_s,
            "step_s": step_s,
            "cpu_step_s": max(r[3] for r in per_rank),
            "call_s": time.perf_counter() - self.started,
            "peak_rss_bytes_per_rank": [int(r[0]) for r in per_rank],
            "save_s": max(r[2] for r in per_rank),
            "checkpoint_bytes": size,
            "load_s": load_s,
            "checkpoint": os.path.basename(ckpt or ""),
        }
        with open(self.out, "w") as f:
            json.dump(result, f)


def _replicas(row: str, devices: int) -> int:
    return 1 if row in SAME_DATA_ROWS else devices


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one row with ``spec["runner"]`` (``"taskfit"`` or ``"raw"``) on every rank. Rank 0 writes the
    result, so this returns ``{"_discard": True}`` (raw: the result on rank 0)."""
    import torch

    torch.set_num_threads(spec["threads"])
    if spec.get("runner", "taskfit") == "raw":
        return _raw_worker(spec)
    from taskfit import Fit

    from benchmarks.fitjobs import mlp_task, step_clock, synthetic_data

    row, strategy, devices, extra, _ = next(r for r in ROWS if r[0] == spec["row"])
    total = spec["steps"] + spec["warmup"]
    out_dir = os.path.join(spec["tmp"], "run")
    args = fit_arguments(out_dir, total, BATCH, strategy, devices, extra)
    data = synthetic_data(BATCH * _replicas(row, devices) * total, SIZES[0], SIZES[-1])
    clock, cpu = step_clock(), CPUClock()
    report = Report(clock, spec["warmup"], spec["out"], out_dir, time.perf_counter(), _replicas(row, devices),
                    cpu)
    if row == "model_parallel":  # the same seed-0 weights, plus the tensor-parallel configure_model
        torch.manual_seed(0)
        module = TPClassifier(SIZES)
    else:
        module = mlp_task(SIZES)
    Fit(args, callbacks=[clock, cpu, report]).fit(module, data)
    return {"_discard": True}


def _raw_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The hand-written loop of ``spec["row"]`` on this rank; the first process (no ``RANK`` in the
    environment) starts the other ranks as taskfit's launcher does, with the ``env://`` variables."""
    import torch
    import torch.distributed as dist

    from benchmarks.fitjobs import mlp_task, synthetic_data
    from benchmarks.raw_loops import train_raw

    row, _, devices, _, _ = next(r for r in ROWS if r[0] == spec["row"])
    _, kind, options = raw_counterpart(row)
    children = []
    if devices > 1 and "RANK" not in os.environ:
        from taskfit.strategies.environments import find_free_port

        base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port()), "WORLD_SIZE": str(devices)}
        for r in range(1, devices):
            children.append(subprocess.Popen([sys.executable, "-m", "benchmarks.worker", "strategies",
                                              json.dumps(spec)], env={**os.environ, **base, "RANK": str(r),
                                                                      "LOCAL_RANK": str(r)}))
        os.environ.update({**base, "RANK": "0", "LOCAL_RANK": "0"})
    rank, world = int(os.environ.get("RANK", "0")), devices
    if kind != "single_device" and not dist.is_initialized():
        if world == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                from taskfit.strategies.environments import find_free_port

                os.environ["MASTER_PORT"] = str(find_free_port())
        dist.init_process_group("gloo", rank=rank, world_size=world)
    total = spec["steps"] + spec["warmup"]
    data = synthetic_data(BATCH * _replicas(row, devices) * total, SIZES[0], SIZES[-1])
    clock: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    train_raw(kind, options, mlp_task(SIZES).net, data, batch=BATCH, steps=total, rank=rank, world=world,
              clock=clock, cpu_clock=cpu)
    mine = [float(peak_rss_bytes()), _per_step(clock, spec["warmup"]), _per_step(cpu, spec["warmup"])]
    if dist.is_initialized() and world > 1:
        gathered = [torch.zeros(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor(mine, dtype=torch.float64))
        per_rank = [g.tolist() for g in gathered]
    else:
        per_rank = [mine]
    for child in children:
        child.wait()
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank != 0:
        return {"_discard": True}
    step_s = max(r[1] for r in per_rank)
    return {"step_s": step_s, "cpu_step_s": max(r[2] for r in per_rank),
            "samples_per_s": BATCH * _replicas(row, devices) / step_s,
            "call_s": time.perf_counter() - started, "peak_rss_bytes_per_rank": [int(r[0]) for r in per_rank],
            "raw": raw_counterpart(row)[0]}


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
        quick: fewer steps, one repetition. out_dir: results folder. reps: taskfit/raw pairs per row (default
        2). device: only ``"cpu"`` rows run on gloo here. threads: ``torch.set_num_threads`` per rank. only: row
        names (ValueError lists valid ones).

    Returns:
        0.
    """
    rows = select_rows("strategy", ROWS, only)
    info = machine_info(threads, device)
    log(f"strategies: {len(rows)} rows ({machine_label(info)})")
    steps, warmup = (QUICK_STEPS, QUICK_WARMUP) if quick else (STEPS, WARMUP)
    reps = reps or (QUICK_REPS if quick else REPS)
    load_before = machine_load()
    log(f"  load before: {load_before['uptime']}")
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for row in sorted(rows, key=lambda r: r[0] not in FIRST):
        name = row[0]
        reason = precheck(row)
        if reason:
            results[name] = {"skipped": reason}
            log(f"  {name:26s} {reason}")
            continue
        runs: dict[str, list[dict[str, Any]]] = {"taskfit": [], "raw": []}
        for _ in range(reps):
            for runner in ("taskfit", "raw"):  # A B A B: drift during the row hits both alike
                spec = {"row": name, "runner": runner, "steps": steps, "warmup": warmup, "device": device}
                runs[runner].append(run_worker("strategies", spec, threads=threads))
        results[name] = _combine(runs)
        res = results[name]
        _partial(out_dir or default_out_dir("strategies", device, quick), info, rows, results)
        log(f"  {name:26s} " + (f"taskfit/raw {compare_ratio(res['ratio'])}, "
                                 f"{res['samples_per_s']:8.1f} samples/s"
                                 if "ratio" in res else str(res.get("error"))[:300]))
    load_after = machine_load()
    log(f"  load after: {load_after['uptime']}")
    data = {
        "machine": info,
        "settings": {"steps": steps, "warmup": warmup, "reps": reps, "batch_per_device": BATCH,
                     "model": f"MLP {'-'.join(map(str, SIZES))}", "threads": threads},
        "load": {"before": load_before, "after": load_after},
        "rows": {r[0]: {"strategy": r[1], "devices": r[2], "extra": r[3], **results[r[0]]} for r in rows},
        "elapsed_s": time.perf_counter() - started,
    }
    out = out_dir or default_out_dir("strategies", device, quick)
    finish("strategies", data, markdown(data), out, _chart)
    partial = os.path.join(out, "results.partial.json")
    if os.path.exists(partial):
        os.remove(partial)
    return 0


def _partial(out: Any, info: dict[str, Any], rows: list[tuple], results: dict[str, Any]) -> None:
    """Write ``results.partial.json`` after every row, so a suite cut short still leaves what it measured."""
    os.makedirs(out, exist_ok=True)
    done = {r[0]: {"strategy": r[1], "devices": r[2], **results[r[0]]} for r in rows if r[0] in results}
    with open(os.path.join(out, "results.partial.json"), "w") as f:
        json.dump({"machine": info, "rows": done}, f, indent=1, default=str)


def _combine(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One row's result from its taskfit and raw runs: per-repetition ratios of the per-step times, the first
    successful taskfit run's throughput / memory / checkpoint figures, every run kept under ``runs``."""
    errors = [r.get("error") or r.get("skipped") for rs in runs.values() for r in rs if "step_s" not in r]
    pairs = [(t["step_s"], r["step_s"]) for t, r in zip(runs["taskfit"], runs["raw"])
             if "step_s" in t and "step_s" in r]
    out: dict[str, Any] = {"runs": runs}
    ok = [t for t in runs["taskfit"] if "step_s" in t]
    if ok:
        first = ok[0]
        out.update({k: first.get(k) for k in ("samples_per_s", "peak_rss_bytes_per_rank", "checkpoint_bytes",
                                              "save_s", "load_s")})
        out["taskfit_step_s"] = summary([t["step_s"] for t in ok])
    raw_ok = [r for r in runs["raw"] if "step_s" in r]
    if raw_ok:
        out["raw_step_s"] = summary([r["step_s"] for r in raw_ok])
        out["raw_samples_per_s"] = statistics.median(r["samples_per_s"] for r in raw_ok)
        out["raw_label"] = raw_ok[0].get("raw")
    if pairs:
        out["ratio"] = summary([t / r for t, r in pairs])
    cpu_pairs = [(t["cpu_step_s"], r["cpu_step_s"]) for t, r in zip(runs["taskfit"], runs["raw"])
                 if t.get("cpu_step_s") and r.get("cpu_step_s")]
    if cpu_pairs:
        out["cpu_ratio"] = summary([t / r for t, r in cpu_pairs])
    if errors:
        out["error"] = errors[0]
    return out


def markdown(data: dict) -> str:
    """One line per strategy row: taskfit next to its raw counterpart, then the taskfit run's figures."""
    s, load = data["settings"], data.get("load", {})

    lines = [
        "### Strategies on one job, against the same job written by hand",
        "",
        (
            f"{machine_label(data['machine'])}; {s['model']}, batch {s['batch_per_device']} per device, AdamW, "
            f"constant LR, no clipping, fp32; {s['steps']} steps timed after {s['warmup']} warm-up steps; "
            f"{s['reps']} repetition(s) per row, taskfit and raw alternating (ABAB), each in fresh processes. "
            "Per-step time: median interval between optimizer steps on the slowest rank; ratio taskfit/raw per "
            "repetition, median (min-max); CPU time taskfit/raw: the same with the CPU seconds of all the "
            "process's threads per step (slowest rank), which other jobs on the machine do not inflate. Load "
            f"average (1, 5, 15 min) before the suite: {fmt_load(load.get('before'))}; after: "
            f"{fmt_load(load.get('after'))}. Throughput, memory and checkpoint columns: the taskfit run "
            "(one checkpoint at the end; load = reading and deserialising every file of it)."
        ),
        "",
    ]
    rows = []
    for name, r in data["rows"].items():
        if "ratio" in r:
            rss = ", ".join(fmt_bytes(b) for b in r["peak_rss_bytes_per_rank"])
            rows.append([
                name, r["devices"], r.get("raw_label", ""), fmt_range(r["taskfit_step_s"], 1e3, 1),
                fmt_range(r["raw_step_s"], 1e3, 1), compare_ratio(r["ratio"]),
                compare_ratio(r.get("cpu_ratio")), f"{r['samples_per_s']:.0f}",
                rss, fmt_bytes(r["checkpoint_bytes"]), f"{r['save_s']:.3f}",
                f"{r['load_s']:.3f}" if r["load_s"] is not None else "-",
                md_note(r["error"]) if r.get("error") else "",
            ])
        else:
            why = "skipped: " + md_note(r["skipped"]) if "skipped" in r else "failed: " + md_note(r.get("error"))
            rows.append([name, r["devices"], "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", why])
    lines.append(md_table(["strategy", "processes", "raw counterpart", "taskfit ms/step", "raw ms/step",
                           "taskfit/raw", "CPU time taskfit/raw", "samples/s (taskfit)", "peak RSS per rank",
                           "checkpoint size", "save s", "load s", "note"], rows))
    return "\n".join(lines) + "\n"


def _ratio_chart(data: dict, done: dict, out: str) -> None:
    """taskfit/raw per-step time per row with min-max whiskers; a ratio from fewer than two repetitions is not
    drawn (a one-repetition quick run spans 0.46 to 1.85 on a shared machine: not enough to compare)."""
    from benchmarks.plots import grouped_bars

    def medians(key: str) -> list[float | None]:
        return [(r.get(key) or {}).get("median") if (r.get(key) or {}).get("n", 0) > 1 else None
                for r in done.values()]

    def spans(key: str) -> list[tuple[float, float] | None]:
        return [(r[key]["min"], r[key]["max"]) if r.get(key) else None for r in done.values()]

    series = {"wall-clock step time": medians("ratio"), "CPU time per step": medians("cpu_ratio")}
    if not any(v is not None for values in series.values() for v in values):
        log(f"strategies_ratio.png not drawn: {NOT_COMPARABLE} (one per row; run without --quick)")
        return
    grouped_bars(
        os.path.join(out, "strategies_ratio.png"),
        list(done),
        series,
        ylabel="taskfit / raw",
        title="taskfit / raw per-step time (median of repetitions, whiskers: min-max; 1.0 = no overhead; rows "
        "with one repetition are not drawn)",
        subtitle=machine_label(data["machine"]),
        baseline=1.0,
        errors={"wall-clock step time": spans("ratio"), "CPU time per step": spans("cpu_ratio")},
    )


def _chart(data: dict, out: str) -> None:
    from benchmarks.plots import grouped_bars

    done = {n: r for n, r in data["rows"].items() if "ratio" in r}
    if not done:
        return
    grouped_bars(
        os.path.join(out, "strategies.png"),
        list(done),
        {"taskfit": [r["samples_per_s"] for r in done.values()],
         "raw": [r["raw_samples_per_s"] for r in done.values()]},
        ylabel="samples/s",
        title="Throughput per strategy: taskfit and the same job written by hand",
        subtitle=machine_label(data["machine"]),
    )
    _ratio_chart(data, done, out)
    grouped_bars(
        os.path.join(out, "strategies_memory.png"),
        list(done),
        {
            "peak RSS per rank, MiB": [max(r["peak_rss_bytes_per_rank"]) / 2**20 for r in done.values()],
            "checkpoint, MiB": [(r["checkpoint_bytes"] or 0) / 2**20 for r in done.values()],
        },
        ylabel="MiB",
        title="Peak memory per rank and checkpoint size (taskfit)",
        subtitle=machine_label(data["machine"]),
    )
