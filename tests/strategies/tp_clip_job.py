"""``clip_grad_value`` / ``clip_grad_norm`` on hand-made DTensor gradients of every placement next to plain ones,
in 2 gloo processes: ``python tp_clip_job.py OUT.pt``. Rank 0 writes the clipped full gradients and the reference
(the same full gradients clipped by torch on one process).

Gradients: ``Shard(0)`` and ``Shard(1)`` (tensor-parallel weights), ``Replicate()`` (a parameter left whole),
``Partial()`` (a sum still pending across the processes: each holds an addend, as a replicated parameter fed
sharded activations gets) and a plain tensor (outside the plan)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

CLIP = 0.3


def full_grads(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 6, generator=g) for _ in range(5)]


def work(rank: int, world: int, out: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from taskfit.strategies.tp_clip import clip_grad_norm, clip_grad_value

    mesh = init_device_mesh("cpu", (world,))
    full = full_grads()
    results = {}
    for mode in ("value", "norm"):
        params = []
        for i, placement in enumerate([Shard(0), Shard(1), Replicate(), Partial(), None]):
            if placement is None:
                p = torch.nn.Parameter(torch.zeros(4, 6))
                p.grad = full[i].clone()
            else:
                p = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 6), mesh, [Replicate()]))
                if isinstance(placement, Partial):  # addends: rank r holds full * (r + 1) / (1 + 2 + ... + world)
                    share = full[i] * (rank + 1) / (world * (world + 1) / 2)
                    p.grad = DTensor.from_local(share, mesh, [Partial()], run_check=False)
                else:
                    p.grad = distribute_tensor(full[i].clone(), mesh, [placement])
            params.append(p)
        norm = clip_grad_value(params, CLIP) if mode == "value" else clip_grad_norm(params, CLIP)
        got = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]
        ref = [torch.nn.Parameter(torch.zeros(4, 6)) for _ in full]
        for q, g in zip(ref, full):
            q.grad = g.clone()
        ref_norm = torch.nn.utils.clip_grad_value_(ref, CLIP) if mode == "value" else \
            torch.nn.utils.clip_grad_norm_(ref, CLIP)
        results[mode] = {"got": [g.detach().clone() for g in got], "ref": [q.grad.clone() for q in ref],
                         "norm": None if norm is None else float(norm),
                         "ref_norm": None if ref_norm is None else float(ref_norm),
                         "placements": [str(getattr(p.grad, "placements", "plain")) for p in params]}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(work, args=(2, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "29561"), nprocs=2)
