"""Checkpoint suite (F-CKPT-4 measured): synchronous and asynchronous checkpoint saving (``checkpoint_io=
"torch"`` / ``"async"``) to a local folder and to ``memory://``, inside a real ``Fit`` run.

The job: a ReLU MLP 784-2048-2048-2048-10 (10 M parameters; checkpoint ~120 MB with AdamW state), batch 32,
20 steps with a checkpoint every 5 (4 saves), plus a row without saving. Per row, in a fresh process,
after one short unmeasured warm-up fit, repeated ``--reps`` times (median, min-max): the whole fit time (s);
the time each save blocks the training
loop (s, from the step's ``on_step_end`` to ``on_save``); the background time of an async save (s); the
checkpoint size (bytes); the load time (s, reading and deserialising every file of the last checkpoint); and,
per storage, the fraction of the synchronous save cost that async saving hides:
``1 - (fit_async - fit_nosave) / (fit_sync - fit_nosave)``. Rows whose plugin or storage is not built are
skipped with the reason.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from benchmarks.common import (
    default_out_dir,
    finish,
    fmt_bytes,
    fmt_range,
    log,
    machine_info,
    machine_label,
    md_note,
    md_table,
    run_worker,
    select_rows,
    summary,
)

SIZES = (784, 2048, 2048, 2048, 10)
QUICK_SIZES = (784, 1024, 1024, 10)
BATCH = 32
STEPS, SAVE_EVERY = 20, 5
QUICK_STEPS, QUICK_SAVE_EVERY = 8, 4
REPS, QUICK_REPS = 3, 1
#: (row name, checkpoint_io name or None for no saving, storage "local" | "memory")
ROWS = [
    ("no_save", None, "local"),
    ("sync_local", "torch", "local"),
    ("async_local", "async", "local"),
    ("sync_memory", "torch", "memory"),
    ("async_memory", "async", "memory"),
]


def precheck(row: tuple) -> str | None:
    """Why ``row`` cannot run here (None when it can): the checkpoint IO plugin is not registered/built."""
    _, io_name, _ = row
    if io_name is None:
        return None
    import taskfit.io as tio

    registry = getattr(tio, "CHECKPOINT_IO", None)
    if registry is None or io_name not in registry:
        return f"checkpoint_io={io_name!r} is not built yet (lands with the checkpoint issue #3)"
    if registry.get(io_name).pending:
        return f"checkpoint_io={io_name!r}: {registry.get(io_name).pending}"
    return None


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the rows in ``spec["rows"]`` once each; returns ``{"rows": {name: result}}``."""
    import torch

    torch.set_num_threads(spec["threads"])
    # one short unmeasured fit first: the process's one-off lazy imports (~1 s) must not land on a row
    _run_row(ROWS[0], {**spec, "steps": 2, "sizes": [8, 8, 2]})
    out = {}
    for name in spec["rows"]:
        try:
            out[name] = _run_row(next(r for r in ROWS if r[0] == name), spec)
        except NotImplementedError as err:
            out[name] = {"skipped": str(err)}
    return {"rows": out}


def _run_row(row: tuple, spec: dict[str, Any]) -> dict[str, Any]:
    from taskfit import Fit, FitArguments

    from benchmarks.common import folder_bytes
    from benchmarks.fitjobs import mlp_task, newest_checkpoint, read_folder, step_clock, synthetic_data

    name, io_name, storage = row
    steps, every, sizes = spec["steps"], spec["save_every"], tuple(spec["sizes"])
    if storage == "memory":
        out_dir = f"memory://taskfit-bench-{uuid.uuid4().hex[:8]}/{name}"
    else:
        out_dir = os.path.join(spec["tmp"], name)
    extra = (
        {"save_strategy": "no"}
        if io_name is None
        else {"save_strategy": "steps", "save_steps": every, "checkpoint_io": io_name}
    )
    args = FitArguments(
        output_dir=out_dir,
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        seed=0,
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        **extra,
    )
    clock = step_clock()
    data = synthetic_data(BATCH * steps, sizes[0], sizes[-1])
    module = mlp_task(sizes)
    start = time.perf_counter()
    fit = Fit(args, accelerator="cpu", callbacks=[clock])
    fit.fit(module, data)
    fit_s = time.perf_counter() - start
    io = fit.strategy.checkpoint_io
    step_gaps = [b - a for a, b in zip(clock.steps, clock.steps[1:])]
    res: dict[str, Any] = {
        "fit_s": fit_s,
        "step_median_s": statistics.median(step_gaps),
        "saves": len(clock.saves),
        "blocking_s": [s for _, s in clock.saves],
        "io_class": type(io).__name__,
    }
    if hasattr(io, "last_background_seconds"):
        res["background_s"] = io.last_background_seconds
    if io_name is not None:
        ckpt = newest_checkpoint(out_dir)
        if ckpt is None:
            raise RuntimeError(f"no checkpoint-N folder under {out_dir}")
        res["load_s"], res["checkpoint_bytes"] = read_folder(ckpt)
        if storage == "local":
            res["checkpoint_bytes"] = folder_bytes(ckpt)
    return res


def run_suite(
    *,
    quick: bool = False,
    out_dir: str | None = None,
    reps: int | None = None,
    device: str = "cpu",
    threads: int = 1,
    only: list[str] | None = None,
) -> int:
    """Run the checkpoint suite; write ``results.json``, ``results.md``, ``checkpoint.png``; print the table.

    Args:
        quick: smaller model, fewer steps, one repetition, one process. out_dir: results folder.
        reps: repetitions (default 3). device: unused (CPU job). threads: ``torch.set_num_threads``.
        only: row names (``no_save`` always runs; ValueError lists the valid names).

    Returns:
        0.
    """
    rows = select_rows("checkpoint", ROWS, only, "no_save")
    reps = reps or (QUICK_REPS if quick else REPS)
    info = machine_info(threads, device)
    spec = {
        "steps": QUICK_STEPS if quick else STEPS,
        "save_every": QUICK_SAVE_EVERY if quick else SAVE_EVERY,
        "sizes": list(QUICK_SIZES if quick else SIZES),
    }
    log(f"checkpoint: {len(rows)} rows x {reps} reps ({machine_label(info)})")
    skipped = {r[0]: reason for r in rows if (reason := precheck(r))}
    for n, reason in skipped.items():
        log(f"  skipped {n}: {reason}")
    runnable = [r[0] for r in rows if r[0] not in skipped]
    per_rep: dict[str, list[dict[str, Any]]] = {n: [] for n in runnable}
    started = time.perf_counter()
    for rep in range(reps):
        for group in [runnable] if quick else [[n] for n in runnable]:  # interleaved rows per repetition
            res = run_worker("checkpoint", {**spec, "rows": group}, threads=threads)
            for n in group:
                r = res.get("rows", {}).get(n) or {k: res[k] for k in ("error", "skipped") if k in res}
                per_rep[n].append(r)
                log(
                    f"  rep {rep} {n:13s} "
                    + (
                        f"fit {r['fit_s']:.2f} s, blocking {sum(r['blocking_s']):.3f} s"
                        if "fit_s" in r
                        else str(r.get("skipped") or r.get("error"))[:300]
                    )
                )
    data = {
        "machine": info,
        "settings": {
            **spec,
            "batch": BATCH,
            "reps": reps,
            "threads": threads,
            "process_per": "repetition" if quick else "row and repetition",
        },
        "rows": _aggregate(rows, per_rep, skipped),
        "elapsed_s": time.perf_counter() - started,
    }
    finish(
        "checkpoint", data, markdown(data), out_dir or default_out_dir("checkpoint", device, quick), _chart
    )
    return 0


def _aggregate(rows: list[tuple], per_rep: dict[str, list[dict]], skipped: dict[str, str]) -> dict[str, Any]:
    agg: dict[str, Any] = {}
    for name, io_name, storage in rows:
        if name in skipped:
            agg[name] = {"io": io_name, "storage": storage, "skipped": skipped[name]}
            continue
        ok = [r for r in per_rep[name] if "fit_s" in r]
        bad = [r.get("skipped") or r.get("error") for r in per_rep[name] if "fit_s" not in r]
        agg[name] = {
            "io": io_name,
            "storage": storage,
            "fit_s": summary([r["fit_s"] for r in ok]),
            "blocking_per_save_s": summary([statistics.mean(r["blocking_s"]) for r in ok if r["blocking_s"]]),
            "background_s": summary([r["background_s"] for r in ok if "background_s" in r]),
            "load_s": summary([r["load_s"] for r in ok if "load_s" in r]),
            "checkpoint_bytes": max(
                (r["checkpoint_bytes"] for r in ok if "checkpoint_bytes" in r), default=None
            ),
            "saves": ok[0]["saves"] if ok else None,
            "io_class": ok[0]["io_class"] if ok else None,
            "per_rep": per_rep[name],
        }
        if bad and not ok:
            agg[name]["skipped" if all(r and "not" in str(r) for r in bad) else "error"] = bad[0]
    base = (agg.get("no_save") or {}).get("fit_s")
    for storage in ("local", "memory"):
        sync, asyn = agg.get(f"sync_{storage}", {}).get("fit_s"), agg.get(f"async_{storage}", {}).get("fit_s")
        if base and sync and asyn and sync["median"] > base["median"]:
            hidden = 1 - (asyn["median"] - base["median"]) / (sync["median"] - base["median"])
            agg[f"async_{storage}"]["hidden_fraction"] = hidden
    return agg


def markdown(data: dict) -> str:
    """One line per row: fit time, cost over no saving, blocking per save, background, size, load."""
    s = data["settings"]
    base = (data["rows"].get("no_save") or {}).get("fit_s")
    lines = [
        "### Checkpoint saving: sync vs async, local vs memory://",
        "",
        (
            f"{machine_label(data['machine'])}; MLP {'-'.join(map(str, s['sizes']))}, batch {s['batch']}, "
            f"{s['steps']} steps, a checkpoint every {s['save_every']} steps; {s['reps']} repetition(s), one "
            f"fresh process per {s['process_per']}; median (min-max)."
        ),
        "",
    ]
    rows = []
    for name, r in data["rows"].items():
        if "fit_s" not in r or not r["fit_s"]:
            rows.append(
                [
                    name,
                    r["io"] or "-",
                    r["storage"],
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "skipped: " + md_note(r.get("skipped"))
                    if "skipped" in r
                    else "failed: " + md_note(r.get("error")),
                ]
            )
            continue
        cost = (r["fit_s"]["median"] - base["median"]) if base and name != "no_save" else None
        hidden = r.get("hidden_fraction")
        rows.append(
            [
                name,
                r["io"] or "-",
                r["storage"],
                fmt_range(r["fit_s"], 1, 2),
                "-" if cost is None else f"{cost:+.2f}",
                fmt_range(r["blocking_per_save_s"], 1, 3),
                fmt_range(r["background_s"], 1, 3),
                fmt_bytes(r["checkpoint_bytes"]),
                fmt_range(r["load_s"], 1, 3),
                "-" if hidden is None else f"{hidden:.0%}",
                "",
            ]
        )
    lines.append(
        md_table(
            [
                "row",
                "checkpoint_io",
                "storage",
                "fit s",
                "cost over no saving, s",
                "blocking per save, s",
                "background per save, s",
                "checkpoint size",
                "load s",
                "save cost hidden by async",
                "note",
            ],
            rows,
        )
    )
    return "\n".join(lines) + "\n"


def _chart(data: dict, out: str) -> None:
    from benchmarks.plots import grouped_bars

    done = {n: r for n, r in data["rows"].items() if r.get("fit_s") and n != "no_save"}
    if not done:
        return
    series = {
        "blocking per save, s": [(r["blocking_per_save_s"] or {}).get("median") for r in done.values()],
        "load, s": [(r["load_s"] or {}).get("median") for r in done.values()],
    }
    grouped_bars(
        os.path.join(out, "checkpoint.png"),
        list(done),
        series,
        ylabel="seconds",
        title="Checkpoint: time a save blocks training, and load time",
        subtitle=machine_label(data["machine"]),
    )
