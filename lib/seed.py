"""Seeding and determinism (F-REPRO-1)."""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from taskfit.accelerators.accelerator import Accelerator


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


def rng_states(accelerator: Accelerator | None = None) -> dict[str, Any]:
    """This process's RNG states as plain values and tensors, so ``torch.load(weights_only=True)`` reads them
    back (mirrors what HF saves as ``rng_state.pth``): ``python``, ``numpy``, ``torch`` (the CPU generator) and,
    under the accelerator's name (``"cuda"``, ``"mps"``, ``"xla"``), the device generator's state from
    :meth:`Accelerator.get_rng_state` when the accelerator has one.

    Args:
        accelerator (Accelerator | None): the run's accelerator; None: host generators only.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {"python": random.getstate(),
                              "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
                              "torch": torch.get_rng_state()}
    device_state = accelerator.get_rng_state() if accelerator is not None else None
    if device_state is not None:
        states[accelerator.name] = device_state
    return states


def set_rng_states(states: dict[str, Any], accelerator: Accelerator | None = None) -> None:
    """Restore what :func:`rng_states` returned; the device part through ``accelerator.set_rng_state`` when the
    states hold one for this accelerator's kind (states saved on another kind leave the device generator alone).

    Args:
        states (dict): :func:`rng_states` output.
        accelerator (Accelerator | None): the run's accelerator; None: host generators only.

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
    if accelerator is not None:
        accelerator.set_rng_state(states.get(accelerator.name))  # None (nothing saved for this kind): a no-op
