"""Workloads of the overhead suite: seeded models, pre-built batches and the optimizer, identical for every
runner (hand-written loop, taskfit, Lightning, HF Trainer).

Batches are built once, before timing, as dicts ``{"x": inputs, "labels": int64 targets}`` and served by a
:class:`TimedBatches` dataset through one ``DataLoader(batch_size=None)``: no per-sample collation is timed
(it would add ~170 µs/step to every runner alike), and the dataset records when each batch is fetched, so
every runner's per-step time comes from the same clock without a framework-specific hook.
"""

from __future__ import annotations

import itertools
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

#: name -> description and sizes; ``steps``/``quick_steps`` are optimizer steps per run
WORKLOADS: dict[str, dict[str, Any]] = {
    "tiny_mlp": {
        "title": "tiny MLP 32-64-64-10, batch 64",
        "kind": "mlp",
        "sizes": (32, 64, 64, 10),
        "batch": 64,
        "steps": 2000,
        "quick_steps": 300,
    },
    "mlp": {
        "title": "MLP 784-512-512-10, batch 128",
        "kind": "mlp",
        "sizes": (784, 512, 512, 10),
        "batch": 128,
        "steps": 200,
        "quick_steps": 40,
    },
    "transformer": {
        "title": "2-layer transformer encoder d128, seq 64, batch 16",
        "kind": "transformer",
        "d_model": 128,
        "heads": 4,
        "ff": 512,
        "layers": 2,
        "seq": 64,
        "vocab": 1000,
        "classes": 10,
        "batch": 16,
        "steps": 50,
        "quick_steps": 15,
    },
}
#: workloads whose overhead ratio ``--check`` gates (step time large enough for a ratio to mean something)
LARGER_WORKLOADS = ("mlp", "transformer")
#: distinct batches built per workload (served cyclically)
N_DISTINCT_BATCHES = 64
LEARNING_RATE = 1e-3


def _identity(batch: Any) -> Any:
    return batch


class TimedBatches(Dataset):
    """``length`` items served cyclically from ``batches``; ``stamps[i]`` is the ``time.perf_counter()`` (s)
    at which item ``i`` was fetched (the start of step ``i`` in every runner). ``faults[i]`` is the process's
    minor page fault count (``getrusage(RUSAGE_SELF).ru_minflt``) at the fetch of item ``i`` for the items in
    ``fault_at`` (set it before the run; read at those fetches only, so other steps pay nothing)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], length: int) -> None:
        self.batches, self.length = batches, length
        self.stamps = [0.0] * length
        self.fault_at: frozenset[int] = frozenset()
        self.faults: dict[int, int] = {}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.stamps[i] = time.perf_counter()
        if i in self.fault_at:
            self.faults[i] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return self.batches[i % len(self.batches)]

    def faults_per_step(self, first: int, last: int) -> float | None:
        """Minor page faults per step between the fetches of items ``first`` and ``last`` (both in
        ``fault_at``); None when either was not fetched."""
        if first not in self.faults or last not in self.faults or last <= first:
            return None
        return (self.faults[last] - self.faults[first]) / (last - first)


class TokenClassifier(nn.Module):
    """Embedding + learned positions + ``nn.TransformerEncoder`` (dropout 0, batch first) + mean pooling +
    linear head. Input ``(batch, seq)`` int64 token ids; output ``(batch, classes)`` logits."""

    def __init__(
        self, vocab: int, seq: int, d_model: int, heads: int, ff: int, layers: int, classes: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.pos).mean(1))


def loss_fn(net: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss every runner computes: cross-entropy of ``net(batch["x"])`` against ``batch["labels"]``."""
    return F.cross_entropy(net(batch["x"]), batch["labels"])


@dataclass
class Job:
    """One workload ready to run: the model, its optimizer, the timed data and the loss."""

    name: str
    net: nn.Module
    optimizer: torch.optim.Optimizer
    data: TimedBatches
    loader: DataLoader
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    steps: int
    batch_size: int


def build_model(name: str) -> nn.Module:
    """The workload's model, initialised from the current torch RNG state (seed it first)."""
    w = WORKLOADS[name]
    if w["kind"] == "mlp":
        sizes = w["sizes"]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])
    return TokenClassifier(w["vocab"], w["seq"], w["d_model"], w["heads"], w["ff"], w["layers"], w["classes"])


def build_batches(name: str, n: int = N_DISTINCT_BATCHES, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``n`` seeded batches ``{"x", "labels"}`` for workload ``name`` (float inputs for MLPs, token ids for
    the
    transformer; labels int64 in ``[0, classes)``)."""
    w = WORKLOADS[name]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if w["kind"] == "mlp":
            x = torch.randn(w["batch"], w["sizes"][0], generator=g)
            classes = w["sizes"][-1]
        else:
            x = torch.randint(0, w["vocab"], (w["batch"], w["seq"]), generator=g)
            classes = w["classes"]
        out.append({"x": x, "labels": torch.randint(0, classes, (w["batch"],), generator=g)})
    return out


def build_job(name: str, steps: int, seed: int = 0, device: str = "cpu") -> Job:
    """Workload ``name`` for ``steps`` optimizer steps: model seeded with ``seed``, AdamW (lr 1e-3, torch
    defaults otherwise, created here so that its one-off import cost is outside every timing), batches on
    ``device``."""
    if name not in WORKLOADS:
        raise ValueError(f"Unknown workload {name!r}; valid: {', '.join(WORKLOADS)}.")
    torch.manual_seed(seed)
    net = build_model(name).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=LEARNING_RATE)
    batches = [{k: v.to(device) for k, v in b.items()} for b in build_batches(name)]
    data = TimedBatches(batches, steps)
    loader = DataLoader(data, batch_size=None, shuffle=False, collate_fn=_identity)
    return Job(name, net, optimizer, data, loader, loss_fn, steps, WORKLOADS[name]["batch"])
