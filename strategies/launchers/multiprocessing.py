"""``strategy="ddp_spawn"``: run ``fit``/``validate``/``predict`` in freshly spawned worker processes and hand rank
0's result back to the calling process (mirrors Lightning's ``_MultiProcessingLauncher``)."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Callable

import torch.multiprocessing as mp

from taskfit.strategies.launchers.threads import threads_per_process


def _worker(local_rank: int, fn: Callable[..., Any], payload: bytes, env: dict[str, str], result_path: str) -> None:
    os.environ.update(env, RANK=str(int(env["NODE_RANK"]) * int(env["_NPROCS"]) + local_rank),
                      LOCAL_RANK=str(local_rank))
    import torch

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # the same count in every worker (launchers.threads)
    args = pickle.loads(payload)  # a private copy per worker (see MultiprocessingLauncher.launch)
    result = fn(*args)
    if local_rank == 0:  # through a file: a queue would need the worker alive (shared memory) or could fill up
        torch.save(result, result_path)
    from taskfit.strategies.process_group import destroy_process_group

    destroy_process_group()  # before the worker exits (see destroy_process_group)


def unguarded_main_call(start_method: str) -> tuple[str, int] | None:
    """Where the running script's top-level code calls us outside an ``if __name__ == "__main__":`` block, as
    ``(file, line)``; None when it does not (or when it cannot tell: no script file, unreadable source).

    ``spawn``/``forkserver`` children re-run the script's top level to find ``fn`` (Python's "safe importing of the
    main module"); unguarded, that top level launches again and the child dies on Python's bootstrapping error while
    the parent blocks writing the payload. ``fork`` children do not re-run it.
    """
    import ast
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if start_method == "fork" or not path or not path.endswith(".py"):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    for node in tree.body:
        guard = isinstance(node, ast.If) and {"__name__", "__main__"} <= set(
            ast.unparse(node.test).replace("'", " ").replace('"', " ").split())
        if guard and node.lineno <= line <= (node.end_lineno or node.lineno):
            return None
    return path, line


class MultiprocessingLauncher:
    """Spawn ``num_processes`` workers (start method ``spawn``: picklable arguments, CUDA-safe) that each run
    ``fn(*args)``; return what rank 0 returned.

    Args:
        num_processes (int): processes on this node.
        num_nodes (int), node_rank (int), main_address (str), main_port (int): the rendezvous.
        start_method (str): ``"spawn"`` (default) or ``"fork"``.
        grace (float): seconds, once a worker failed, before the others are terminated, and from SIGTERM to
            SIGKILL (mirrors the ``grace_period`` of ``torch.multiprocessing``'s ``ProcessContext.join``).
    """

    def __init__(self, num_processes: int, num_nodes: int, node_rank: int, main_address: str, main_port: int,
                 start_method: str = "spawn", grace: float = 2.5) -> None:
        self.num_processes, self.num_nodes, self.node_rank = num_processes, num_nodes, node_rank
        self.grace = float(grace)
        self.main_address, self.main_port, self.start_method = main_address, main_port, start_method

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the workers and return rank 0's result.

        Raises:
            RuntimeError: the calling script runs this from its top level without an ``if __name__ ==
                "__main__":`` guard (start method ``spawn``: the children would re-run it; the message gives the fix).
            ValueError: ``OMP_NUM_THREADS`` is set but not a positive integer.

        Every worker computes with the same number of torch threads: ``OMP_NUM_THREADS`` when set, else the cores
        divided equally among the workers (``launchers.threads``).
        """
        where = unguarded_main_call(self.start_method)
        if where is not None:
            raise RuntimeError(
                f"strategy='ddp_spawn' starts its workers by re-running {where[0]!r} (start method "
                f"'{self.start_method}'), and line {where[1]} of that script launches the run outside the main guard, "
                "so every worker would launch again and the run would hang. Put the script's top-level code under\n"
                '    if __name__ == "__main__":\n'
                "        main()\n"
                "(Python's 'safe importing of the main module'), or use strategy='ddp', which starts every worker as a "
                "fresh run of the whole script, as torchrun does.")
        env = {"MASTER_ADDR": self.main_address, "MASTER_PORT": str(self.main_port),
               "WORLD_SIZE": str(self.num_processes * self.num_nodes), "NODE_RANK": str(self.node_rank),
               "TASKFIT_LAUNCHED": "1", "OMP_NUM_THREADS": str(threads_per_process(self.num_processes)),
               "LOCAL_WORLD_SIZE": str(self.num_processes), "_NPROCS": str(self.num_processes)}
        fd, path = tempfile.mkstemp(prefix="taskfit-spawn-", suffix=".pt")
        os.close(fd)
        try:
            # plain pickle bytes: torch.multiprocessing would hand every worker the SAME shared-memory tensors,
            # so the replicas' optimizers would all update one set of weights
            payload = pickle.dumps(args)
            context = mp.start_processes(_worker, args=(fn, payload, env, path), nprocs=self.num_processes,
                                         join=False, start_method=self.start_method)
            # once a worker failed, the others get ``grace`` s to end, then SIGTERM, then ``grace`` s more before
            # SIGKILL (torch's default waits 30 s for a SIGTERM that a stopped worker never acts on)
            while not context.join(grace_period=self.grace):
                pass
            import torch

            return torch.load(path, weights_only=False)  # written by our own worker just now
        finally:
            os.unlink(path)
