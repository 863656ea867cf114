"""Distributed strategies on one device (``devices=1``) in the GPU proof kit: DDP and FSDP2 on NCCL (gloo on the
CPU), DeepSpeed ZeRO-2 and ZeRO-3 in one process when DeepSpeed travelled; each against the single-device
``32-true`` run of the matrix's job (``tests/gpu/matrix.py``). Run by ``python tests/gpu/kit.py dist``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from kit import Report, Skip, compare
from matrix import fit_lm

#: row name -> (strategy, relative loss tolerance): DDP with one process is the plain step; FSDP2 and ZeRO
#: reorder the reductions and DeepSpeed runs its own optimizer step
ROWS = {
    "DDP devices=1": ("ddp", 1e-5),
    "FSDP2 devices=1": ("fsdp", 1e-3),
    "DeepSpeed ZeRO-2 one process": ("deepspeed_stage_2", 1e-2),
    "DeepSpeed ZeRO-3 one process": ("deepspeed_stage_3", 1e-2),
}


def row_reference(device: str, sizes: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The single-device ``32-true`` loss (no process group)."""
    _fit, _model, out = fit_lm(device, sizes, tf32=False if device == "cuda" else None)
    state["ref"] = out.training_loss
    return {"status": "pass", "loss": out.training_loss}


def row_strategy(device: str, sizes: dict[str, Any], state: dict[str, Any], strategy: str, rtol: float) -> dict:
    """``Fit(strategy=strategy, devices=1)``: the loss against the reference, the process group's backend."""
    import torch.distributed as dist

    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise Skip("deepspeed is not installed (did not travel in gpu-wheels)")
    fit, _model, out = fit_lm(device, sizes, strategy=strategy, devices=1,
                              tf32=False if device == "cuda" else None)
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    values = {"strategy": type(fit.strategy).__name__, "backend": backend, "world_size": fit.strategy.world_size}
    row = compare(out.training_loss, state["ref"], rtol, **values)
    if device == "cuda" and backend not in (None, "nccl") and not strategy.startswith("deepspeed"):
        row.update(status="fail", reason=f"backend {backend}, expected nccl")
    return row


def run_part(report: Report, device: str, sizes: dict[str, Any]) -> None:
    """The reference, then each strategy row."""
    state: dict[str, Any] = {}
    report.run("single device (reference)", row_reference, device, sizes, state)
    if "ref" not in state:
        return
    for name, (strategy, rtol) in ROWS.items():
        report.run(name, row_strategy, device, sizes, state, strategy, rtol)
