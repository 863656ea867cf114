"""taskfit benchmark suites (F-BENCH-1..4), run from a source checkout:

    python -m benchmarks SUITE [--quick] [--check] [--out DIR] [--reps N] [--threads N] [--device cpu|cuda]
    taskfit bench SUITE ...              (the same, through the taskfit command line)

Suites: ``overhead`` (taskfit against a hand-written loop and the peers' trainers), ``techniques`` (every
row of the single-GPU efficiency guide), ``strategies`` (single device, DDP, FSDP, DeepSpeed), ``checkpoint``
(sync/async saving, local and ``memory://``), ``packing`` (packed vs padded rows on the LoRA example). Results go to ``benchmarks/results/<suite>/`` as
``results.json``, ``results.md`` and PNG charts; see ``benchmarks/README.md``.
"""

from __future__ import annotations

#: suite name -> one-line description
SUITES = {
    "overhead": "taskfit vs a hand-written PyTorch loop (and Lightning / HF Trainer): per-step overhead, "
    "import time, peak RSS, final-weight difference",
    "techniques": "efficiency-guide techniques on the MiniLM tweet classifier: throughput and peak memory",
    "strategies": "single device, DDP, FSDP, DeepSpeed on one job: throughput, memory per rank, checkpoints",
    "checkpoint": "sync vs async checkpoint saving, local and memory://: save/load time, size, hidden time",
    "packing": "LoRA fine-tuning on packed vs padded rows: real tokens per step and per second, padding",
}

__all__ = ["SUITES"]
