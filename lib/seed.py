"""Seeding and determinism (F-REPRO-1)."""

from __future__ import annotations

import os
from typing import Any
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed ``random``, ``numpy`` and ``torch`` (all devices) with ``seed``; mirrors HF ``set_seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def enable_full_determinism(seed: int) -> None:
    """Seed everything and make PyTorch pick deterministic kernels (``full_determinism=True``).

    Sets ``torch.use_deterministic_algorithms(True)``, cuDNN deterministic/non-benchmark mode and the
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` workspace CUDA needs for deterministic matmuls, as HF
    ``enable_full_determinism`` does.
    """
    seed_everything(seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def rng_states() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and, when in use, CUDA / MPS) as plain values and
    tensors, so ``torch.load(weights_only=True)`` reads them back (mirrors what HF saves as ``rng_state.pth``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {"python": random.getstate(),
                              "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
                              "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        states["mps"] = torch.mps.get_rng_state()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned (device states only where that device is present).

    Raises:
        ValueError: ``states`` lacks the python, numpy or torch entry.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in states]
    if missing:
        raise ValueError(f"RNG state is missing {missing}; the checkpoint was not written by taskfit.")
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "mps" in states and hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.set_rng_state(states["mps"])
