"""Performance rows of the GPU proof kit, in one process on one device, reusing the overhead suite's runners
(``benchmarks/runners.py``: hand-written loop, taskfit ``Fit``, taskfit ``Engine``, Lightning, HF Trainer) and its
timing (the interval between batch fetches, ``benchmarks/workloads.py``): the tiny MLP's overhead in µs/step
against the hand-written loop, and a GPT-2-small-sized model built from a config (bf16 autocast inside the loss,
the same for every runner) in tokens/s and MFU against the device's dense bf16 peak. Run by
``python tests/gpu/kit.py perf``.
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

import torch
from kit import Report, Skip
from torch.utils.data import DataLoader

from benchmarks import runners
from benchmarks.common import Skip as BenchSkip
from benchmarks.common import step_times
from benchmarks.workloads import Job, TimedBatches, build_job

RUNNERS = ("raw", "taskfit", "engine", "lightning", "hf")
#: dense bf16 tensor-core peak (FLOP/s) by device name (NVIDIA data sheets, SXM parts without sparsity)
BF16_PEAK = {"H200": 989e12, "H100 SXM": 989e12, "H100 80GB HBM3": 989e12, "H100 PCIe": 756e12, "H100": 989e12,
             "A100": 312e12}


def _timed(runner: str, job: Any, warmup: int) -> float:
    """Median seconds per step of ``runner`` on ``job`` (after ``warmup`` steps), device synchronised."""
    try:
        runners.run(runner, job, tempfile.mkdtemp(prefix=f"gpu-kit-{runner}-"))
    except BenchSkip as why:
        raise Skip(str(why)) from None
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return statistics.median(step_times(job.data.stamps, warmup))


def row_tiny_mlp(device: str, sizes: dict[str, Any], runner: str, ref: dict[str, float]) -> dict[str, Any]:
    """The overhead suite's tiny MLP (32-64-64-10, batch 64, AdamW, fp32): median µs/step over ``mlp_reps``
    repetitions and the difference from the hand-written loop."""
    steps, warmup = sizes["mlp_steps"], max(5, sizes["mlp_steps"] // 10)
    per_rep = [_timed(runner, build_job("tiny_mlp", steps, device=device), warmup) for _ in range(sizes["mlp_reps"])]
    us = statistics.median(per_rep) * 1e6
    ref.setdefault("raw", us)
    return {"status": "pass", "us_per_step": us, "overhead_us": us - ref["raw"], "ratio": us / ref["raw"],
            "reps": sizes["mlp_reps"], "steps": steps}


def _lm_job(device: str, lm: dict[str, Any]) -> Job:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=lm["vocab"], n_positions=lm["seq"], n_embd=lm["n_embd"], n_layer=lm["n_layer"],
                     n_head=lm["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    net = GPT2LMHeadModel(cfg).to(device)
    g = torch.Generator().manual_seed(1)
    batches = [{"x": (ids := torch.randint(0, lm["vocab"], (lm["batch"], lm["seq"]), generator=g)).to(device),
                "labels": ids.to(device)} for _ in range(4)]
    data = TimedBatches(batches, lm["steps"])
    loader = DataLoader(data, batch_size=None, shuffle=False, collate_fn=lambda b: b)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(device, dtype=dtype, enabled=device == "cuda"):
            return model(input_ids=batch["x"], labels=batch["labels"]).loss

    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=device == "cuda")
    return Job("gpt2", net, opt, data, loader, loss, lm["steps"], lm["batch"])


def _peak(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in BF16_PEAK.items() if k in name), None)


def row_gpt2(device: str, sizes: dict[str, Any], runner: str, ref: dict[str, float]) -> dict[str, Any]:
    """GPT-2-small-sized LM from a config (12 x 768, seq 1024, batch 8 on the GPU): tokens/s, the ratio to the
    hand-written loop and MFU = (6 N + 12 L d T) FLOP/token x tokens/s / bf16 peak (PaLM's estimate)."""
    lm = sizes["lm"]
    job = _lm_job(device, lm)
    n_params = sum(p.numel() for p in job.net.parameters() if p.requires_grad)
    try:
        step_s = _timed(runner, job, lm["warmup"])
    finally:
        del job
        if device == "cuda":
            torch.cuda.empty_cache()
    tokens_s = lm["batch"] * lm["seq"] / step_s
    ref.setdefault("raw", tokens_s)
    flops_per_token = 6 * n_params + 12 * lm["n_layer"] * lm["n_embd"] * lm["seq"]
    peak = _peak(device)
    return {"status": "pass", "tokens_per_s": tokens_s, "step_ms": step_s * 1e3, "ratio_to_raw": tokens_s / ref["raw"],
            "params": n_params, "mfu": flops_per_token * tokens_s / peak if peak else None, "bf16_peak": peak}


def run_part(report: Report, device: str, sizes: dict[str, Any]) -> None:
    """Tiny MLP then GPT-2, every runner each (the hand-written loop first: the others are compared with it)."""
    mlp_ref: dict[str, float] = {}
    lm_ref: dict[str, float] = {}
    for runner in RUNNERS:
        report.run(f"tiny MLP: {runner}", row_tiny_mlp, device, sizes, runner, mlp_ref)
    for runner in RUNNERS:
        report.run(f"GPT-2 from config: {runner}", row_gpt2, device, sizes, runner, lm_ref)
