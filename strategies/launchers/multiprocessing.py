"""``strategy="ddp_spawn"``: run ``fit``/``validate``/``predict`` in freshly spawned worker processes and hand rank
0's result back to the calling process (mirrors Lightning's ``_MultiProcessingLauncher``)."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch.multiprocessing as mp


def _worker(local_rank: int, fn: Callable[..., Any], args: tuple, env: dict[str, str], queue: Any) -> None:
    os.environ.update(env, RANK=str(int(env["NODE_RANK"]) * int(env["_NPROCS"]) + local_rank),
                      LOCAL_RANK=str(local_rank))
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = fn(*args)
    if local_rank == 0:
        queue.put(result)


class MultiprocessingLauncher:
    """Spawn ``num_processes`` workers (start method ``spawn``: picklable arguments, CUDA-safe) that each run
    ``fn(*args)``; return what rank 0 returned.

    Args:
        num_processes (int): processes on this node.
        num_nodes (int), node_rank (int), main_address (str), main_port (int): the rendezvous.
        start_method (str): ``"spawn"`` (default) or ``"fork"``.
    """

    def __init__(self, num_processes: int, num_nodes: int, node_rank: int, main_address: str, main_port: int,
                 start_method: str = "spawn") -> None:
        self.num_processes, self.num_nodes, self.node_rank = num_processes, num_nodes, node_rank
        self.main_address, self.main_port, self.start_method = main_address, main_port, start_method

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        env = {"MASTER_ADDR": self.main_address, "MASTER_PORT": str(self.main_port),
               "WORLD_SIZE": str(self.num_processes * self.num_nodes), "NODE_RANK": str(self.node_rank),
               "TASKFIT_LAUNCHED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "_NPROCS": str(self.num_processes)}
        ctx = mp.get_context(self.start_method)
        queue = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(fn, args, env, queue), nprocs=self.num_processes, join=True,
                           start_method=self.start_method)
        return queue.get()
