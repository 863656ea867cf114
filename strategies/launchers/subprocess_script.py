"""Re-launching the running script in worker processes (``python train.py`` with ``Fit(strategy="ddp",
devices=2)``), as ``torchrun`` would. Mirrors Lightning's ``_SubprocessScriptLauncher``."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import time
from typing import Any

from taskfit.strategies import process_group
from taskfit.strategies.environments.held import export_held, held, hold_back
from taskfit.strategies.launchers.threads import set_process_threads, threads_per_process

log = logging.getLogger("taskfit")


def script_command() -> list[str]:
    """The command line that started this process (``python -m pkg.mod ...`` kept as such).

    Raises:
        RuntimeError: no script to re-run (an interactive session or a notebook).
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        return [sys.executable, "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    if not sys.argv or not sys.argv[0] or not os.path.exists(sys.argv[0]):
        raise RuntimeError("strategy='ddp' with several devices re-launches the running script in worker processes, "
                           "but there is no script here (interactive session or notebook). Use strategy='ddp_spawn', "
                           "or run the script with torchrun.")
    return [sys.executable, *sys.argv]


def start_worker() -> None:
    """In a worker the script launcher started, at its ``launch()``: export the held-back rank variables and compute
    with the run's thread count (the ``OMP_NUM_THREADS`` the launcher gave it). A no-op in any other process."""
    if not held():
        return
    export_held()
    set_process_threads(threads_per_process(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


#: exit codes of a worker that stopped gracefully on SIGINT / SIGTERM / SIGUSR1 (rank 0 reports the stop)
_STOPPED_ON_SIGNAL = (130, 143, 138)


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or a debugger's stop), from ``/proc`` (False where there is
    none, e.g. macOS: such a worker is then killed after the usual ``grace``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class SubprocessScriptLauncher:
    """Start local ranks 1..n-1 of this node as copies of the running command; this process is local rank 0.

    Each worker re-runs the whole command with ``RANK``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TASKFIT_LAUNCHED=1`` and ``OMP_NUM_THREADS`` set from its start; its ``LOCAL_RANK``, ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE`` are held back until its own ``launch()`` (this process exports all of them at
    :meth:`launch`), so no library forms a process group above ``launch()`` in a worker alone
    (``environments.held``). Every process, this one included, computes with the same
    number of torch threads: ``OMP_NUM_THREADS`` when set, else the cores divided equally
    (``launchers.threads``). At exit this process waits for its workers, bounded:
    ``join_timeout`` seconds after a successful run, ``grace`` seconds after a failed one (an exception, or a
    failed collective: the workers then fail on their own within ``ddp_timeout``); workers still running are then
    terminated (SIGTERM), and after ``grace`` more seconds killed (SIGKILL), and reaped, so no orphan or zombie
    remains. After a failure a stopped worker (SIGSTOP) is killed as soon as it is the only kind left (it would
    neither exit nor act on SIGTERM), and this process's own exit is bounded too (``process_group.bound_exit``):
    the whole job ends within ``ddp_timeout`` plus a few seconds.

    Args:
        num_processes (int): processes on this node.
        num_nodes (int): nodes.
        node_rank (int): this node's index.
        main_address (str), main_port (int): the rendezvous.
        join_timeout (float): seconds to wait for the workers at the end of a successful run (``ddp_timeout`` plus
            a few seconds).
        grace (float): seconds before escalating after a failure, and from SIGTERM to SIGKILL.
    """

    def __init__(self, num_processes: int, num_nodes: int, node_rank: int, main_address: str, main_port: int,
                 join_timeout: float = 1805.0, grace: float = 5.0) -> None:
        self.num_processes, self.num_nodes, self.node_rank = num_processes, num_nodes, node_rank
        self.main_address, self.main_port = main_address, main_port
        self.join_timeout, self.grace = float(join_timeout), float(grace)
        self.failed = False  # set by the strategy when a collective failed
        self.procs: list[subprocess.Popen] = []

    @property
    def launched(self) -> bool:
        return bool(self.procs)

    def launch(self) -> None:
        """Give this process its thread count, export its rank variables and start the other local ranks (their
        rank variables held back until their own ``launch()``, see ``environments.held``).

        Raises:
            ValueError: ``OMP_NUM_THREADS`` is set but not a positive integer.
        """
        world = self.num_processes * self.num_nodes
        threads = threads_per_process(self.num_processes)
        set_process_threads(threads)  # rank 0 too: torch started before OMP_NUM_THREADS could reach it
        common = {"MASTER_ADDR": self.main_address, "MASTER_PORT": str(self.main_port),
                  "NODE_RANK": str(self.node_rank), "TASKFIT_LAUNCHED": "1", "OMP_NUM_THREADS": str(threads)}
        ranks = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(self.num_processes)}
        os.environ.update(common, **ranks, RANK=str(self.node_rank * self.num_processes), LOCAL_RANK="0")
        cmd = script_command()
        for local in range(1, self.num_processes):
            visible = {**os.environ, **common, "RANK": str(self.node_rank * self.num_processes + local)}
            self.procs.append(subprocess.Popen(cmd, env=hold_back(visible, {**ranks, "LOCAL_RANK": str(local)})))
        log.info("Launched %d worker process(es) of %s (world size %d, rendezvous %s:%d).", len(self.procs),
                 " ".join(cmd[1:3]), world, self.main_address, self.main_port)
        atexit.register(self.join)

    def join(self, timeout: float | None = None) -> list[int]:
        """Wait for the workers (at most ``timeout`` seconds; default ``join_timeout``, or ``grace`` when this run
        failed), then terminate and kill those still running; returns their exit codes (negative: the signal).
        After a failure a stopped worker (SIGSTOP) is killed at once: it cannot exit on its own, nor act on
        SIGTERM; and the rest of this process's exit is bounded (``process_group.bound_exit``)."""
        failed = self.failed or getattr(sys, "last_value", None) is not None  # an uncaught exception
        if timeout is None:
            timeout = self.grace if failed else self.join_timeout
        if failed:  # every wait below, then the interpreter's shutdown
            process_group.bound_exit(timeout + self.grace + process_group.EXIT_GRACE_S)
        t0 = time.monotonic()
        codes = self._wait(timeout, give_up_on_stopped=failed)
        late = [i for i, c in enumerate(codes) if c is None]
        if late:
            log.error("Worker process(es) (local ranks %s) still running %.1f s after this one ended; ending them.",
                      [i + 1 for i in late], time.monotonic() - t0)
            for i in late:
                if _is_stopped(self.procs[i].pid):
                    self.procs[i].kill()  # SIGTERM stays pending in a stopped process
                else:
                    self.procs[i].terminate()
            deadline = time.monotonic() + self.grace
            for i in late:
                try:
                    codes[i] = self.procs[i].wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.procs[i].kill()
                    codes[i] = self.procs[i].wait()
        if failed:
            process_group.bound_exit(process_group.EXIT_GRACE_S)
        bad = [(i + 1, c) for i, c in enumerate(codes) if c and c not in _STOPPED_ON_SIGNAL]  # those reported it
        if bad:
            log.error("Worker process(es) exited with errors (local rank, exit code): %s", bad)
        return [int(c) for c in codes if c is not None]

    def _wait(self, timeout: float, give_up_on_stopped: bool) -> list[int | None]:
        """Exit codes of the workers that ended within ``timeout`` s (None: still running); with
        ``give_up_on_stopped``, stop waiting as soon as every worker left is stopped (SIGSTOP)."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = [None] * len(self.procs)
        while True:
            codes = [c if c is not None else p.poll() for c, p in zip(codes, self.procs)]
            pending = [p for c, p in zip(codes, self.procs) if c is None]
            if not pending or time.monotonic() >= deadline:
                return codes
            if give_up_on_stopped and all(_is_stopped(p.pid) for p in pending):
                return codes
            time.sleep(0.05)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "procs": []}
