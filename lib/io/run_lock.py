"""One run per ``output_dir`` (issue 30): the lock a training run holds on its local ``output_dir`` so that a
second run started on the same folder refuses to start instead of interleaving its checkpoints with the first.

The lock is ``fcntl.flock`` on ``output_dir/.taskfit-run.lock``, which the operating system releases when the
holding process ends, however it ends (SIGKILL, out-of-memory kill, power loss of a node of a shared disk that
supports it): a killed run never leaves it stuck. The file holds the holder's pid, host and start time, which the
refusal names. The holder deletes the file when it releases the lock; a stale file left by a killed run is simply
locked again by the next run.

Where no lock is taken (``run_lock`` yields False): ``output_dir`` on an fsspec store (``s3://``, ``gs://``,
``memory://``...: object stores have no lock that a killed process releases) and platforms without ``fcntl``
(Windows). On network file systems the lock is as good as their ``flock`` (NFSv4 emulates it with POSIX locks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

from taskfit.io.checkpoint_io import filesystem, is_local_fs

log = logging.getLogger("taskfit")

LOCK_NAME = ".taskfit-run.lock"
#: lock files this process holds -> nesting depth: a run started inside a run of the same process (the tuner's
#: finder callbacks, an HPO trial) is the same run's work, not a second run
_HELD: dict[str, int] = {}


class RunLockedError(RuntimeError):
    """Another live process holds the run lock of this ``output_dir``; the message names it (pid, host)."""


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it is still starting)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info['pid']} on host {info.get('host', '?')}, started {started}"


def _acquire(path: str) -> int:
    """An open descriptor of ``path`` holding its exclusive ``flock``; retried when the file was replaced between
    opening and locking (a releasing holder deletes it), so two processes never hold two different files."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"output_dir {os.path.dirname(path)!r} is in use by another taskfit run ({_holder(path)}): two runs "
                "on one output_dir would interleave their checkpoints. Wait for it to end, stop it, or choose "
                "another output_dir.") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # locked a file its holder had just deleted: lock the new one


@contextlib.contextmanager
def run_lock(output_dir: str, enabled: bool = True) -> Iterator[bool]:
    """Hold the run lock of ``output_dir`` for the block (creating the folder; it is removed again at the end if
    the run left it empty). Yields True when a lock is held, False where none is taken (``enabled`` False, e.g. a
    process other than global rank 0; an fsspec URL; no ``fcntl``).

    Args:
        output_dir (str): the run's ``output_dir`` (local path or fsspec URL).
        enabled (bool): take the lock (only the global-zero process does).

    Raises:
        RunLockedError: another live process holds the lock (names its pid and host).
    """
    fs, inner = filesystem(output_dir) if enabled else (None, "")
    if not enabled or not is_local_fs(fs) or os.name != "posix":
        if enabled:
            log.debug("No run lock on %s (only local output_dirs on POSIX systems are locked).", output_dir)
        yield False
        return
    created = not os.path.isdir(inner)
    os.makedirs(inner, exist_ok=True)
    path = os.path.realpath(os.path.join(inner, LOCK_NAME))
    if _HELD.get(path):
        _HELD[path] += 1
        try:
            yield True
        finally:
            _HELD[path] -= 1
        return
    try:
        fd = _acquire(path)
    except BaseException:
        _remove_if_empty(inner, created)
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode())
        _HELD[path] = 1
        yield True
    finally:
        _HELD.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path)  # still locked: a process waiting on this file retries on the new one
        os.close(fd)
        _remove_if_empty(inner, created)


def _remove_if_empty(folder: str, created: bool) -> None:
    """Remove ``folder`` if the lock created it and the run wrote nothing there (the run's footprint unchanged)."""
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


__all__ = ["LOCK_NAME", "RunLockedError", "run_lock"]
