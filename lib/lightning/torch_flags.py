"""Lightning's ``Trainer(deterministic=...)``: PyTorch's deterministic-algorithms switch and the cuBLAS workspace,
set when the trainer is built (Lightning's accelerator connector), and nothing else in the environment."""

from __future__ import annotations

import os
from typing import Any

import torch


def set_deterministic(deterministic: Any) -> None:
    """Apply ``Trainer(deterministic=...)`` as Lightning: None leaves PyTorch as it is; True/False call
    ``torch.use_deterministic_algorithms`` (which covers cuDNN); ``"warn"`` does so with ``warn_only=True``. When
    on, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set (CUDA needs it for deterministic matmuls); unlike
    HF's ``full_determinism``, ``CUDA_LAUNCH_BLOCKING`` is left alone.

    Raises:
        ValueError: a value other than None, True, False or ``"warn"``.
    """
    if deterministic is None:
        return
    if deterministic not in (True, False, "warn"):
        raise ValueError(f"Trainer(deterministic={deterministic!r}) is not valid; choose None, True, False or "
                         "'warn'.")
    torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
