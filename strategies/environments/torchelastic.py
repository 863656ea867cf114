"""Processes started by ``torchrun`` (torch elastic), the ``deepspeed`` launcher or taskfit's own launcher: all
of them export ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``."""

from __future__ import annotations

import os

from taskfit.strategies.environments.base import ClusterEnvironment
from taskfit.strategies.environments.held import lookup

_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchElasticEnvironment(ClusterEnvironment):
    """Rank and rendezvous from the standard ``env://`` variables (mirrors Lightning's
    ``TorchElasticEnvironment``). ``name`` tells which launcher set them: ``torchrun`` (``TORCHELASTIC_RUN_ID``),
    ``taskfit`` (``TASKFIT_LAUNCHED``) or ``env`` (e.g. the DeepSpeed launcher). In a worker of taskfit's script
    launcher the rank variables are held back until ``launch()`` (see ``environments.held``) and read from there."""

    creates_processes_externally = True

    @staticmethod
    def detect() -> bool:
        return all(lookup(k) is not None for k in _REQUIRED)

    @property
    def name(self) -> str:  # type: ignore[override]
        if "TORCHELASTIC_RUN_ID" in os.environ:
            return "torchrun"
        return "taskfit" if os.environ.get("TASKFIT_LAUNCHED") else "env"

    def world_size(self) -> int:
        return int(lookup("WORLD_SIZE"))

    def global_rank(self) -> int:
        return int(lookup("RANK"))

    def local_rank(self) -> int:
        return int(lookup("LOCAL_RANK"))

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
