"""Gradient-norm clipping over DTensor shards mixed with plain tensors (tensor parallelism leaves the parameters
outside its plan plain). ``torch.nn.utils.clip_grad_norm_`` stacks the per-tensor norms, which fails when DTensors
of different meshes or placements meet plain tensors; here each kind is reduced on its own and combined."""

from __future__ import annotations

import math
from typing import Any

import torch


def total_grad_norm(parameters: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm of the gradients of ``parameters`` as a plain 0-dim tensor, equal (to rounding) to the
    norm of the full, unsharded gradients: DTensor gradients are grouped by mesh and placements, each group's norm
    is reduced across its mesh (``full_tensor``: shards summed, replicas counted once); plain gradients (replicated
    on every process) are counted once as they are."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = {}
    plain: list[torch.Tensor] = []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            groups.setdefault((g.device_mesh, tuple(g.placements)), []).append(g)
        else:
            plain.append(g)
    squares = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        squares.append(norm.full_tensor().float() ** 2)
    if plain:
        squares.append(torch.nn.utils.get_total_norm(plain, 2.0).float() ** 2)
    if not squares:
        return torch.tensor(0.0)
    return torch.stack([s.to(squares[0].device) for s in squares]).sum().sqrt()


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale every gradient of ``parameters`` by ``max_norm / (norm + 1e-6)`` when the global norm
    (:func:`total_grad_norm`) exceeds ``max_norm`` (``torch.nn.utils.clip_grad_norm_``'s rule); returns the norm
    before clipping. ``max_norm=inf`` only measures."""
    from torch.distributed.tensor.experimental import implicit_replication

    parameters = [p for p in parameters if p.grad is not None]
    norm = total_grad_norm(parameters)
    if math.isinf(max_norm) or not parameters:
        return norm
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    with implicit_replication(), torch.no_grad():  # the 0-dim factor acts as a replicated value on DTensors
        for p in parameters:
            p.grad.mul_(coef.to(p.grad.device))
    return norm
