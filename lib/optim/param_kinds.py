"""Parameter groups that hold one kind of tensor each (F-SCALE-1): plain tensors apart from ``DTensor``s, and
``DTensor``s of different device meshes apart from each other.

Tensor parallelism splits some layers into ``DTensor``s and leaves the rest (an embedding, a head) plain. The
multi-tensor optimizer kernels (``fused=True``, ``foreach=True``; torch's default on CUDA) run one call per
parameter group and refuse a call that mixes them: ``aten._fused_adamw_.default got mixed torch.Tensor and
DTensor``. Splitting each group into one sub-group per kind, with the same hyperparameters, gives the same update
(AdamW's step is elementwise per parameter) and keeps HF's decay / no-decay semantics: every sub-group keeps its
group's ``weight_decay``. Groups are split only when the optimizer runs such a kernel: the per-parameter loop
(torch's choice on the CPU for ``adamw_torch``) accepts mixed groups, and its checkpoints keep their layout.
"""

from __future__ import annotations

import sys
from typing import Any


def _kind(p: Any, dtensor: type | None) -> Any:
    """``None`` for a plain tensor, else the ``DTensor``'s device mesh (hashable; equal meshes are one kind)."""
    return p.device_mesh if dtensor is not None and isinstance(p, dtensor) else None


def split_by_tensor_kind(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split every parameter group that mixes plain tensors and ``DTensor``s (or ``DTensor``s on different device
    meshes) into sub-groups of one kind each, in order of first appearance, with the group's other keys copied.

    A group of one kind is returned as it is (the same dict), so the layout of every model without ``DTensor``s,
    and of every model whose groups are already uniform (FSDP2 over the whole module), is unchanged. Costs
    nothing when ``torch.distributed.tensor`` was never imported (then no ``DTensor`` exists).

    Args:
        groups (list[dict]): ``torch.optim`` parameter groups (``{"params": [...], "weight_decay": ..., ...}``).

    Returns:
        list[dict]: the groups, mixed ones replaced by their sub-groups (decay sub-groups stay before no-decay);
        ``groups`` itself (the same list) when no group is mixed.
    """
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    if dtensor is None:
        return groups
    out: list[dict[str, Any]] = []
    split = False
    for group in groups:
        by_kind: dict[Any, list[Any]] = {}
        for p in group["params"]:
            by_kind.setdefault(_kind(p, dtensor), []).append(p)
        if len(by_kind) <= 1:
            out.append(group)
            continue
        out.extend({**group, "params": params} for params in by_kind.values())
        split = True
    return out if split else groups


def uses_multi_tensor_kernel(optimizer: Any) -> bool:
    """Whether a ``torch.optim`` optimizer steps each group with one fused or foreach call: ``fused=True``,
    ``foreach=True``, or ``foreach=None`` where torch's own default (``_default_to_fused_or_foreach``: CUDA
    parameters) picks foreach. Optimizers without these options (bitsandbytes, Lion, ...) answer False.

    Args:
        optimizer (torch.optim.Optimizer): a constructed optimizer (no step taken yet is fine).
    """
    defaults = getattr(optimizer, "defaults", {})
    if defaults.get("fused") or defaults.get("foreach"):
        return True
    if "foreach" not in defaults:
        return False
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in optimizer.param_groups for p in g["params"]]
    return bool(_default_to_fused_or_foreach(params, bool(defaults.get("differentiable")), use_fused=False)[1])
