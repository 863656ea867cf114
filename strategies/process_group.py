"""The end of a process group, apart from the strategies so that the launchers (below them) can call it: the
worker processes a launcher starts tear the group down before they exit. After a failed collective (a peer
stopped, vanished or timed out), every further wait of this process is bounded: later collectives fail at once,
teardown does not wait for the stuck peer, and the rest of the exit runs under a watchdog (:func:`bound_exit`)."""

from __future__ import annotations

import datetime
import faulthandler
import os
import threading
from typing import IO

import torch.distributed as dist

collective_failed = False  # a collective of this process failed: peers may be gone or stuck
#: seconds that the end of a failed process may take after its last bounded wait (destroying the group, the other
#: exit handlers, interpreter shutdown: module teardown alone takes several seconds on a loaded 2-core machine)
EXIT_GRACE_S = 3.0
_watchdog_sink: IO[str] | None = None


def mark_failed() -> None:
    """Record that a collective of this process failed: see :data:`collective_failed`."""
    global collective_failed
    collective_failed = True


def reset() -> None:
    """A new process group was formed: its collectives start healthy."""
    global collective_failed
    collective_failed = False


def bound_exit(seconds: float) -> None:
    """End this process with exit code 1 if it is still alive ``seconds`` from now (re-arming replaces the last
    deadline). A native thread does it (``faulthandler.dump_traceback_later(exit=True)``), so the bound holds
    in interpreter shutdown too, where a destructor can wait on a stopped peer (as torchelastic's agent kills a
    worker that does not end, this process kills itself). Only armed after a failed collective.

    Args:
        seconds (float): from now, > 0.
    """
    global _watchdog_sink
    if _watchdog_sink is None:
        _watchdog_sink = open(os.devnull, "w")  # noqa: SIM115 - must stay open for the native thread
    faulthandler.dump_traceback_later(seconds, repeat=False, file=_watchdog_sink, exit=True)


def destroy_process_group() -> None:
    """Tear the process group down before the interpreter exits: left to interpreter shutdown, gloo's worker
    threads can still be joinable when their destructors run, which aborts the process ("terminate called without
    an active exception") after training finished. After a failed collective the closing barrier is skipped (a
    stuck peer would only make this process wait), the destruction gets at most :data:`EXIT_GRACE_S` seconds (gloo's
    destructor drains queued work, each item waiting up to ``ddp_timeout`` on a stopped peer) and the rest of the
    exit runs under :func:`bound_exit`."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if collective_failed:
        bound_exit(2 * EXIT_GRACE_S)  # the launcher's join re-arms it with its own waits
        worker = threading.Thread(target=_destroy_quietly, name="taskfit-destroy-process-group", daemon=True)
        worker.start()
        worker.join(EXIT_GRACE_S)
        return
    try:
        # let every rank arrive first: a peer closing its sockets while this rank's gloo threads still read
        # from them aborts the process
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    except Exception:  # a peer already died: nothing to wait for
        pass
    _destroy_quietly()


def _destroy_quietly() -> None:
    try:
        dist.destroy_process_group()
    except Exception:  # exiting anyway; a failed teardown must not hide the run's own result
        pass
