"""Seeding and determinism (F-REPRO-1)."""

from __future__ import annotations

import os
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
