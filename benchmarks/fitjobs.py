"""Pieces the ``Fit``-driven suites (strategies, checkpoint, techniques) share: a classifier TaskModule over
an MLP, a synthetic dataset, a callback that timestamps optimizer steps and saves, and timed reading of a
checkpoint folder."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from taskfit import Callback, TaskModule


class MLPClassifier(TaskModule):
    """A TaskModule: ReLU MLP with layer widths ``sizes`` (input first, classes last), cross-entropy on
    ``(x, y)`` batches, the default optimizer from the arguments (so strategies such as DeepSpeed can build
    their own). Defined at module level so that spawn-started ranks can unpickle it."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return F.cross_entropy(self.net(x), y)


def mlp_task(sizes: tuple[int, ...], seed: int = 0) -> MLPClassifier:
    """:class:`MLPClassifier` over ``sizes``, initialised from ``seed``."""
    torch.manual_seed(seed)
    return MLPClassifier(tuple(sizes))


def synthetic_data(n: int, features: int, classes: int, seed: int = 1) -> Any:
    """``TensorDataset`` of ``n`` seeded samples: float32 ``(features,)`` inputs, int64 labels in
    ``[0, classes)``."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g))


class StepClock(Callback):
    """Records ``time.perf_counter()`` (s) at every ``on_step_end`` (``steps``) and at every ``on_save``
    (``saves``: ``(global_step, seconds since that step's on_step_end)``)."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.saves: list[tuple[int, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(time.perf_counter())

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.saves.append((state.global_step, time.perf_counter() - self.steps[-1]))


def step_clock() -> StepClock:
    """A fresh :class:`StepClock`."""
    return StepClock()


def read_folder(path: str, storage_options: dict | None = None) -> tuple[float, int]:
    """Read and deserialise every file under ``path`` (a local folder or an fsspec URL): ``torch.load`` for
    ``.pt``/``.bin``, safetensors for ``.safetensors``, plain bytes otherwise. Returns ``(seconds, bytes)``.

    Raises:
        FileNotFoundError: nothing at ``path``.
    """
    import io

    import fsspec
    import torch

    fs, _, (root,) = fsspec.get_fs_token_paths(path, storage_options=storage_options or {})
    if not fs.exists(root):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    start = time.perf_counter()
    size = 0
    for name in fs.find(root):
        with fs.open(name, "rb") as f:
            blob = f.read()
        size += len(blob)
        if name.endswith((".pt", ".bin")):
            torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
        elif name.endswith(".safetensors"):
            from safetensors.torch import load

            load(blob)
    return time.perf_counter() - start, size


def newest_checkpoint(output_dir: str, storage_options: dict | None = None) -> str | None:
    """Path of the ``checkpoint-N`` folder with the largest N under ``output_dir`` (local or URL), or None."""
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(output_dir, storage_options=storage_options or {})
    if not fs.exists(root):
        return None
    found = []
    for entry in fs.ls(root, detail=False):
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith("checkpoint-") and base[len("checkpoint-") :].isdigit():
            found.append((int(base[len("checkpoint-") :]), base))
    if not found:
        return None
    base = max(found)[1]
    return f"{output_dir.rstrip('/')}/{base}" if "://" in output_dir else os.path.join(output_dir, base)
