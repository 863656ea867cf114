"""Gradient clipping over DTensor shards mixed with plain tensors (tensor parallelism leaves the parameters outside
its plan plain). ``torch.nn.utils.clip_grad_norm_`` stacks the per-tensor norms, which fails when DTensors of
different meshes or placements meet plain tensors; here each kind is reduced on its own and combined. Clipping by
value is elementwise, so it clamps each process's local shard (a pending-sum ``Partial`` gradient is summed
first: clamping its addends would not clamp the sum)."""

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


def clip_grad_value(parameters: list[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient of ``parameters`` to ``[-clip_value, clip_value]`` in place
    (``torch.nn.utils.clip_grad_value_``'s rule), equal to clamping the full, unsharded gradients: plain gradients
    and the local shards of DTensor gradients (``Shard`` / ``Replicate`` placements) are clamped as they are, in
    one ``foreach`` call per device and dtype; a DTensor gradient with a ``Partial`` placement (a sum still
    pending across processes) is first reduced to ``Replicate`` on those mesh dimensions and put back as the
    parameter's gradient.

    Args:
        parameters (list[Tensor]): the parameters whose ``.grad`` to clamp (those without one are skipped).
        clip_value (float): the bound (> 0).
    """
    from torch.distributed.tensor import DTensor, Replicate

    v = float(clip_value)
    local: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    with torch.no_grad():
        for p in parameters:
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                if any(pl.is_partial() for pl in g.placements):
                    g = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])
                    p.grad = g
                g = g.to_local()  # under no_grad: the DTensor's own storage, so the clamp lands in it
            local.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), grads in local.items():
            if device.type in ("cpu", "cuda") and all(type(t) is torch.Tensor for t in grads):
                torch._foreach_clamp_min_(grads, -v)
                torch._foreach_clamp_max_(grads, v)
            else:  # tensor subclasses and devices without foreach kernels: one by one, as torch's slow path
                for t in grads:
                    t.clamp_(-v, v)
