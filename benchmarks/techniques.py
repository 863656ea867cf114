"""Techniques suite (F-BENCH-2): each row of the single-GPU efficiency guide ("Methods and tools for efficient
training on a single GPU") toggled on one realistic job, the demo's MiniLM tweet classifier
(``examples/finetune_text_classifier.py``: pretrained all-MiniLM-L6-v2, 22.7 M parameters, real election
tweets, max length 64), trained through ``Fit`` for a fixed number of optimizer steps.

Measured per row, in a fresh process (``--quick``: one process for all rows, a randomly initialised 1-layer
model of the same width, batch sizes divided by 4, shorter sequences, fewer steps; a smoke run whose memory
figures are not comparable between rows): throughput in samples/s over the steps after the
warm-up (from ``on_step_end`` timestamps), peak memory during the fit (peak RSS in bytes on CPU, after
resetting the process's high-water mark just before ``Fit``; CUDA peak allocated bytes on GPU) and both
relative to the baseline row. Rows whose feature is not built yet, or that need hardware or packages that
are absent, are skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    Skip,
    default_out_dir,
    finish,
    fmt_bytes,
    fmt_load,
    log,
    machine_info,
    machine_label,
    machine_load,
    md_note,
    md_table,
    package_version,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    run_worker,
    select_rows,
)

#: the guide's table: method -> (improves training speed, optimizes memory utilization)
GUIDE = {
    "Batch size choice": ("Yes", "Yes"),
    "Gradient accumulation": ("No", "Yes"),
    "Gradient checkpointing": ("No", "Yes"),
    "Mixed precision training": ("Yes", "(No)"),
    "Optimizer choice": ("Yes", "Yes"),
    "Data preloading": ("Yes", "No"),
    "DeepSpeed Zero": ("No", "Yes"),
    "torch.compile": ("Yes", "No"),
}
BASE_BATCH = 16
#: (name, label, guide method, FitArguments overrides, requirement: None | "cuda" | distribution name)
ROWS: list[tuple[str, str, str, dict[str, Any], str | None]] = [
    ("baseline", f"baseline: batch {BASE_BATCH}, fp32, AdamW", "-", {}, None),
    ("batch_32", "batch 32", "Batch size choice", {"per_device_train_batch_size": 32}, None),
    ("batch_8", "batch 8", "Batch size choice", {"per_device_train_batch_size": 8}, None),
    (
        "accum_2x8",
        "batch 8 x accumulation 2",
        "Gradient accumulation",
        {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2},
        None,
    ),
    ("grad_ckpt", "gradient checkpointing", "Gradient checkpointing", {"gradient_checkpointing": True}, None),
    ("bf16_mixed", "bf16-mixed", "Mixed precision training", {"precision": "bf16-mixed"}, None),
    ("fp16_mixed", "16-mixed", "Mixed precision training", {"precision": "16-mixed"}, None),
    ("bf16_true", "bf16-true", "Mixed precision training", {"precision": "bf16-true"}, None),
    ("tf32", "tf32", "Mixed precision training", {"tf32": True}, "cuda"),
    ("adamw_fused", "AdamW fused", "Optimizer choice", {"optim": "adamw_torch_fused"}, None),
    ("adafactor", "Adafactor", "Optimizer choice", {"optim": "adafactor"}, None),
    (
        "adamw_8bit",
        "8-bit AdamW (bitsandbytes)",
        "Optimizer choice",
        {"optim": "adamw_bnb_8bit"},
        "bitsandbytes",
    ),
    (
        "workers_2",
        "2 loader workers + pin memory",
        "Data preloading",
        {"dataloader_num_workers": 2, "dataloader_pin_memory": True, "dataloader_persistent_workers": True},
        None,
    ),
    ("compile", "torch.compile", "torch.compile", {"torch_compile": True}, None),
    ("zero2", "DeepSpeed ZeRO-2", "DeepSpeed Zero", {"strategy": "deepspeed_stage_2"}, "deepspeed"),
]
#: rows left out of ``--quick`` runs, with the reason
QUICK_SKIP = {"compile": "left out of --quick runs (compiling takes ~35 s here); the full run measures it"}
STEPS, WARMUP = 10, 2
#: rows timed over fewer steps than STEPS (full runs only): (steps, warm-up, why), shown in the table's note
ROW_STEPS: dict[str, tuple[int, int, str]] = {
    "fp16_mixed": (3, 1, "float16 autocast on CPU has no fast GEMM kernels here (over 10x slower than fp32)"),
}
#: measured right after the baseline (the table is printed in ROWS order)
FIRST = ("zero2",)
QUICK_STEPS, QUICK_WARMUP = 3, 1


def _example() -> Any:
    """The demo module ``examples/finetune_text_classifier.py`` (data loading and the classifier)."""
    path = REPO_ROOT / "examples" / "finetune_text_classifier.py"
    spec = importlib.util.spec_from_file_location("taskfit_example_text_classifier", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def precheck(row: tuple, device: str) -> str | None:
    """Why ``row`` cannot run here (None when it can): a pending feature, missing hardware or package."""
    _name, _, _, overrides, need = row
    if need == "cuda" and not device.startswith("cuda"):
        return "needs a CUDA device"
    if need and need != "cuda" and package_version(need) is None:
        return f"{need} is not installed"
    from taskfit import FitArguments

    try:
        FitArguments(output_dir="unused", **overrides)
    except ValueError as err:
        return f"not accepted: {err}"
    from taskfit.optim.optimizers import OPTIMIZERS
    from taskfit.precision import PRECISIONS
    from taskfit.strategies import STRATEGIES

    for key, registry in (("optim", OPTIMIZERS), ("precision", PRECISIONS), ("strategy", STRATEGIES)):
        if key in overrides and overrides[key] in registry and registry.get(overrides[key]).pending:
            return f"{overrides[key]!r}: {registry.get(overrides[key]).pending}"
    return None


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Train the classifier once per row in ``spec["rows"]``; returns ``{"rows": {name: result}}`` with
    ``samples_per_s``, ``step_s`` (median, seconds), ``peak_bytes``, ``rss_before_bytes``, ``train_loss``,
    or ``skipped``/``error`` per row."""
    import torch

    torch.set_num_threads(spec["threads"])
    example = _example()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(example.model_path()))
    tweets = example.read_tweets()
    out: dict[str, Any] = {"rows": {}}
    for name in spec["rows"]:
        row = next(r for r in ROWS if r[0] == name)
        try:
            out["rows"][name] = _run_row(row, spec, example, tokenizer, tweets)
        except (Skip, NotImplementedError) as err:
            out["rows"][name] = {"skipped": str(err)}
        # a technique that fails here is reported, the other rows still run
        except Exception as err:  # noqa: BLE001
            out["rows"][name] = {"error": f"{type(err).__name__}: {err}"}
    return out


def _run_row(row: tuple, spec: dict[str, Any], example: Any, tokenizer: Any, tweets: Any) -> dict[str, Any]:
    import numpy as np
    import torch
    from taskfit import Fit, FitArguments

    from benchmarks.fitjobs import step_clock

    name, _, _, overrides, _ = row
    steps, warmup = spec["steps"], spec["warmup"]
    scale = spec.get("batch_scale", 1.0)
    batch = max(1, round(overrides.get("per_device_train_batch_size", BASE_BATCH) * scale))
    overrides = {**overrides, "per_device_train_batch_size": batch}
    per_step = batch * overrides.get("gradient_accumulation_steps", 1)
    n = per_step * (steps + warmup)
    texts, labels = tweets["text"].values[:n], tweets["label"].values[:n]
    data = example.TweetDataset(list(texts), np.asarray(labels), tokenizer, spec["max_length"])
    module = _classifier(example, spec["small_model"])

    clock = step_clock()  # on_step_end timestamps (s)
    args = FitArguments(
        output_dir=os.path.join(spec["tmp"], name),
        max_steps=steps + warmup,
        seed=0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        learning_rate=5e-5,
        **overrides,
    )
    cuda = spec["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    reset_peak_rss()
    rss0 = rss_bytes()
    start = time.perf_counter()
    fit = Fit(args, accelerator="cuda" if cuda else "cpu", callbacks=[clock])
    result = fit.fit(module, data)
    call_s = time.perf_counter() - start
    measured = clock.steps[warmup - 1 :] if warmup else [start, *clock.steps]
    span = measured[-1] - measured[0]
    diffs = [b - a for a, b in itertools.pairwise(measured)]
    step_s = statistics.median(diffs)
    res = {
        "samples_per_s": per_step / step_s,  # the median step: one disturbed step (shared machine) does not count
        "mean_samples_per_s": per_step * (len(measured) - 1) / span,
        "step_s": step_s,
        "samples_per_step": per_step,
        "steps": steps,
        "warmup": warmup,
        "call_s": call_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_before_bytes": rss0,
        "train_loss": float(result.training_loss),
    }
    res["peak_bytes"] = torch.cuda.max_memory_allocated() if cuda else res["peak_rss_bytes"] - rss0
    res["memory_kind"] = "CUDA peak allocated" if cuda else "peak RSS increase during the fit"
    return res


#: the memory cell of a row measured in the same process as earlier rows
SHARED_PROCESS_MEMORY = "n/a: rows share one process (--quick)"


def relative_to_baseline(results: dict[str, dict[str, Any]], per_row_memory: bool) -> dict[str, dict[str, Any]]:
    """Add ``speed_vs_baseline`` and ``memory_vs_baseline`` (ratios to the ``baseline`` row) to each measured row
    of ``results`` (in place; also returned).

    Args:
        results: row name -> measurement (``samples_per_s``, ``peak_bytes``).
        per_row_memory (bool): each row ran in its own process (or on CUDA, whose peak counter resets per row).
            When False (``--quick`` on CPU: one process), a later row's peak-RSS increase is only what it added to
            memory the earlier rows already took, so its memory ratio is None and ``memory_note`` says why.
    """
    base = results.get("baseline", {})
    for name, r in results.items():
        if "samples_per_s" not in r or "samples_per_s" not in base:
            continue
        r["speed_vs_baseline"] = r["samples_per_s"] / base["samples_per_s"]
        if per_row_memory or name == "baseline":
            r["memory_vs_baseline"] = r["peak_bytes"] / base["peak_bytes"] if base["peak_bytes"] > 0 else None
        else:
            r["memory_vs_baseline"], r["memory_note"] = None, SHARED_PROCESS_MEMORY
    return results


def _classifier(example: Any, small: bool) -> Any:
    """The pretrained MiniLM classifier, or (``small``) a randomly initialised 1-layer model of its width."""
    import torch

    if not small:
        return example.build_module(seed=0)
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(str(example.model_path()), num_labels=2, num_hidden_layers=1)
    torch.manual_seed(0)
    return example.TweetClassifier(AutoModelForSequenceClassification.from_config(config))


def run_suite(
    *,
    quick: bool = False,
    out_dir: str | None = None,
    reps: int | None = None,
    device: str = "cpu",
    threads: int = 1,
    only: list[str] | None = None,
) -> int:
    """Run the techniques suite; write ``results.json``, ``results.md``, ``techniques.png``; print the table.

    Args:
        quick: small model, short sequences, few steps, all rows in one process.
        out_dir: results folder (default ``benchmarks/results/techniques/``).
        reps: unused (one run per row; the rows are long enough).
        device: ``"cpu"`` or ``"cuda"``.
        threads: ``torch.set_num_threads`` in the workers.
        only: row names to run (default all); unknown names raise ValueError listing the valid ones.

    Returns:
        0.
    """
    rows = select_rows("technique", ROWS, only, "baseline")
    info = machine_info(threads, device)
    spec = {
        "steps": QUICK_STEPS if quick else STEPS,
        "warmup": QUICK_WARMUP if quick else WARMUP,
        "max_length": 32 if quick else 64,
        "small_model": quick,
        "device": device,
        "batch_scale": 0.25 if quick else 1.0,
    }
    log(f"techniques: {len(rows)} rows ({machine_label(info)})")
    results: dict[str, Any] = {}
    runnable = []
    for row in rows:
        reason = precheck(row, device)
        if quick and row[0] in QUICK_SKIP and not reason:
            reason = QUICK_SKIP[row[0]]
        if reason:
            results[row[0]] = {"skipped": reason}
            log(f"  skipped {row[0]}: {reason}")
        else:
            runnable.append(row[0])
    started = time.perf_counter()
    load_before = machine_load()
    log(f"  load before: {load_before['uptime']}")
    # the rows the committed table could not run go first (after the baseline): a run cut short still has them
    runnable.sort(key=lambda n: (n != "baseline", n not in FIRST))
    batches = [runnable] if quick else [[n] for n in runnable]
    for group in batches:
        short = ROW_STEPS.get(group[0]) if not quick and len(group) == 1 else None
        steps = {"steps": short[0], "warmup": short[1]} if short else {}
        res = run_worker("techniques", {**spec, **steps, "rows": group}, threads=threads)
        for n in group:
            results[n] = res.get("rows", {}).get(n) or {k: res[k] for k in ("error", "skipped") if k in res}
            r = results[n]
            _partial(out_dir or default_out_dir("techniques", device, quick), results)
            log(
                f"  {n:12s} "
                + (
                    f"{r['samples_per_s']:7.1f} samples/s  peak {fmt_bytes(r['peak_bytes'])}"
                    if "samples_per_s" in r
                    else str(r.get("skipped") or r.get("error"))[:200]
                )
            )
    load_after = machine_load()
    log(f"  load after: {load_after['uptime']}")
    relative_to_baseline(results, per_row_memory=not quick or device.startswith("cuda"))
    model = (
        "random-init 1-layer MiniLM-width BERT, batch sizes / 4 (quick smoke run; memory figures of "
        "later rows are not comparable: one process)"
        if quick
        else "all-MiniLM-L6-v2 + classification head (22.7 M parameters)"
    )
    data = {
        "machine": info,
        "settings": {
            **spec,
            "threads": threads,
            "model": model,
            "base_batch": BASE_BATCH,
            "process_per": "suite" if quick else "row",
        },
        "load": {"before": load_before, "after": load_after},
        "rows": {r[0]: {"label": r[1], "method": r[2], "overrides": r[3], **results[r[0]]} for r in rows},
        "elapsed_s": time.perf_counter() - started,
    }
    out = out_dir or default_out_dir("techniques", device, quick)
    finish("techniques", data, markdown(data), out, _chart)
    if os.path.exists(os.path.join(out, "results.partial.json")):
        os.remove(os.path.join(out, "results.partial.json"))
    return 0


def _partial(out: Any, results: dict[str, Any]) -> None:
    """Write ``results.partial.json`` after every row, so a suite cut short still leaves what it measured."""
    import json

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.partial.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


def markdown(data: dict) -> str:
    """The guide's table with measured numbers, one line per row."""
    s = data["settings"]
    lines = [
        "### Efficiency techniques, measured",
        "",
        (
            f"{machine_label(data['machine'])}; {s['model']}, election tweets, max length {s['max_length']}; "
            f"{s['steps']} optimizer steps timed after {s['warmup']} warm-up steps (samples/s from the median step "
            f"time); one fresh process per {s['process_per']}. Memory: {_memory_kind(s['device'])}. Load average "
            f"(1, 5, 15 min) before the suite: {fmt_load(data.get('load', {}).get('before'))}; after: "
            f"{fmt_load(data.get('load', {}).get('after'))}."
        ),
        "",
    ]
    rows = []
    for name, r in data["rows"].items():
        guide = GUIDE.get(r["method"], ("", ""))
        if "samples_per_s" in r and r.get("steps", s["steps"]) != s["steps"]:
            why = ROW_STEPS.get(name)
            note = f"{r['steps']} timed steps after {r['warmup']} warm-up" + (f": {why[2]}" if why else "")
            guide = (guide[0], f"{guide[1]} — {note}")
        if "samples_per_s" in r:
            rows.append(
                [
                    r["method"],
                    r["label"],
                    f"{r['samples_per_s']:.1f}",
                    f"{r.get('speed_vs_baseline', 1):.2f}x",
                    r.get("memory_note") or fmt_bytes(r["peak_bytes"]),
                    r.get("memory_note") or _ratio(r.get("memory_vs_baseline")),
                    f"{r['train_loss']:.4f}",
                    guide[0],
                    guide[1],
                ]
            )
        else:
            rows.append(
                [
                    r["method"],
                    r["label"],
                    "skipped" if "skipped" in r else "failed",
                    "",
                    "",
                    "",
                    "",
                    guide[0],
                    guide[1] + " — " + md_note(r.get("skipped") or r.get("error"), 160),
                ]
            )
    lines.append(
        md_table(
            [
                "method (guide)",
                "row",
                "samples/s",
                "speed vs baseline",
                "peak memory",
                "memory vs baseline",
                "train loss",
                "guide: speed",
                "guide: memory / note",
            ],
            rows,
        )
    )
    return "\n".join(lines) + "\n"


def _memory_kind(device: str) -> str:
    if device.startswith("cuda"):
        return "CUDA peak allocated"
    return "peak RSS increase during the fit (high-water mark reset before Fit)"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _chart(data: dict, out: str) -> None:
    from benchmarks.plots import grouped_bars

    done = {n: r for n, r in data["rows"].items() if "samples_per_s" in r}
    if not done:
        return
    groups = [r["label"] for r in done.values()]
    series = {"throughput vs baseline": [r.get("speed_vs_baseline") for r in done.values()]}
    memory = [r.get("memory_vs_baseline") for r in done.values()]
    shared = any(r.get("memory_note") for r in done.values())
    if not shared:  # a one-process quick run measures no per-row memory: no bars that would claim it
        series["peak memory vs baseline"] = memory
    grouped_bars(
        os.path.join(out, "techniques.png"),
        groups,
        series,
        ylabel="relative to the baseline row",
        title="Efficiency techniques: throughput" + (" (memory: not per row in a one-process quick run)" if shared
                                                     else " and peak memory") + " (baseline = 1)",
        subtitle=machine_label(data["machine"]),
        baseline=1.0,
    )
