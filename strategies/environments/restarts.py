"""Whether this process is a restart that an elastic launcher made after a failure: ``torchrun --max-restarts=N``
sets ``TORCHELASTIC_RESTART_COUNT`` (0 on the first attempt) and ``TORCHELASTIC_MAX_RESTARTS``; SLURM sets
``SLURM_RESTART_COUNT`` on a requeued job. A restart should continue from the newest complete checkpoint instead
of training from scratch again (what Lightning's ``ckpt_path="last"`` / torchtitan's auto-resume do)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Restart:
    """An elastic restart of this process.

    Attributes:
        launcher (str): ``"torchrun"`` or ``"slurm"``.
        count (int): how many times the launcher has restarted the job (>= 1).
        max_restarts (int | None): the launcher's limit (``torchrun --max-restarts``), None when unknown.
    """

    launcher: str
    count: int
    max_restarts: int | None = None

    def describe(self) -> str:
        limit = f" of at most {self.max_restarts}" if self.max_restarts is not None else ""
        return f"{self.launcher} restart {self.count}{limit}"


def _int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:  # a malformed variable is not a restart signal
        return None


def elastic_restart() -> Restart | None:
    """The restart this process is part of, or None on a first attempt / outside an elastic launcher.

    ``TORCHELASTIC_RESTART_COUNT`` > 0 (torchrun) wins over ``SLURM_RESTART_COUNT`` > 0 (a requeued SLURM job).
    """
    count = _int("TORCHELASTIC_RESTART_COUNT")
    if count:
        return Restart("torchrun", count, _int("TORCHELASTIC_MAX_RESTARTS"))
    count = _int("SLURM_RESTART_COUNT")
    if count:
        return Restart("slurm", count)
    return None
