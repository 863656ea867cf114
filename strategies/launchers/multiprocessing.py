"""``strategy="ddp_spawn"``: run ``fit``/``validate``/``predict`` in freshly spawned worker processes and hand rank
0's result back to the calling process (mirrors Lightning's ``_MultiProcessingLauncher``)."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Callable

import torch.multiprocessing as mp


def _worker(local_rank: int, fn: Callable[..., Any], payload: bytes, env: dict[str, str], result_path: str) -> None:
    os.environ.update(env, RANK=str(int(env["NODE_RANK"]) * int(env["_NPROCS"]) + local_rank),
                      LOCAL_RANK=str(local_rank))
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = pickle.loads(payload)  # a private copy per worker (see MultiprocessingLauncher.launch)
    result = fn(*args)
    if local_rank == 0:  # through a file: a queue would need the worker alive (shared memory) or could fill up
        torch.save(result, result_path)
    from taskfit.strategies.process_group import destroy_process_group

    destroy_process_group()  # before the worker exits (see destroy_process_group)


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
        fd, path = tempfile.mkstemp(prefix="taskfit-spawn-", suffix=".pt")
        os.close(fd)
        try:
            # plain pickle bytes: torch.multiprocessing would hand every worker the SAME shared-memory tensors,
            # so the replicas' optimizers would all update one set of weights
            payload = pickle.dumps(args)
            mp.start_processes(_worker, args=(fn, payload, env, path), nprocs=self.num_processes, join=True,
                               start_method=self.start_method)
            import torch

            return torch.load(path, weights_only=False)  # written by our own worker just now
        finally:
            os.unlink(path)
