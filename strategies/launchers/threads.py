"""How many CPU threads each process of a run computes with: the same number in every rank, the launching process
included."""

from __future__ import annotations

import os
from collections.abc import Mapping


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_process(local_world_size: int, environ: Mapping[str, str] | None = None,
                        cores: int | None = None) -> int:
    """Torch threads for each of ``local_world_size`` processes on one machine: ``OMP_NUM_THREADS`` when the user
    set it (it wins, as with ``torchrun``), else an equal share of the cores, ``cores // local_world_size`` (at
    least 1; Accelerate's launcher divides the same way, ``torchrun`` uses 1), so that the processes neither
    oversubscribe the CPU nor leave one rank with more threads than the others.

    Args:
        local_world_size (int): processes on this machine.
        environ (Mapping[str, str] | None): the environment to read ``OMP_NUM_THREADS`` from (``os.environ``).
        cores (int | None): cores to share (:func:`usable_cores`).

    Raises:
        ValueError: ``OMP_NUM_THREADS`` set to something other than a positive integer (names the value).
    """
    environ = os.environ if environ is None else environ
    given = environ.get("OMP_NUM_THREADS")
    if given is not None and given.strip():
        if not given.strip().isdigit() or int(given) < 1:
            raise ValueError(f"OMP_NUM_THREADS={given!r} must be a positive integer (threads per process), or "
                             "unset to share the cores equally among the run's processes.")
        return int(given)
    cores = usable_cores() if cores is None else int(cores)
    return max(1, cores // max(1, int(local_world_size)))


def set_process_threads(threads: int) -> None:
    """Compute with ``threads`` torch threads in this process from now on (``torch.set_num_threads``; torch read
    ``OMP_NUM_THREADS`` once, when it started, so setting the variable later changes nothing for this process),
    and export ``OMP_NUM_THREADS`` for the processes it starts later (data-loader workers)."""
    import torch

    torch.set_num_threads(int(threads))
    os.environ["OMP_NUM_THREADS"] = str(int(threads))
