"""The end of a process group, apart from the strategies so that the launchers (below them) can call it: the
worker processes a launcher starts tear the group down before they exit."""

from __future__ import annotations

import datetime

import torch.distributed as dist

collective_failed = False  # a collective of this process failed: peers may be gone or stuck


def destroy_process_group() -> None:
    """Tear the process group down before the interpreter exits: left to interpreter shutdown, gloo's worker
    threads can still be joinable when their destructors run, which aborts the process ("terminate called without
    an active exception") after training finished. After a failed collective the closing barrier is skipped (a
    stuck peer would only make this process wait)."""
    if dist.is_available() and dist.is_initialized():
        try:
            # let every rank arrive first: a peer closing its sockets while this rank's gloo threads still read
            # from them aborts the process
            if dist.get_backend() == "gloo" and not collective_failed:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
        except Exception:  # a peer already died: nothing to wait for
            pass
        try:
            dist.destroy_process_group()
        except Exception:  # exiting anyway; a failed teardown must not hide the run's own result
            pass
