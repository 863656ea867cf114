"""Processes started by SLURM (``srun``): ranks from ``SLURM_*`` variables (mirrors Lightning's
``SLURMEnvironment``)."""

from __future__ import annotations

import os
import re

from taskfit.strategies.environments.base import ClusterEnvironment


def first_host(nodelist: str) -> str:
    """The first host name of a SLURM node list: ``"node[03-05,9],gpu1"`` -> ``"node03"``."""
    nodelist = nodelist.strip()
    m = re.match(r"^([^\[,]+)(\[([^\]]+)\])?", nodelist)
    if not m:
        return nodelist or "127.0.0.1"
    prefix, ranges = m.group(1), m.group(3)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


class SLURMEnvironment(ClusterEnvironment):
    """``SLURM_NTASKS`` processes; rank ``SLURM_PROCID``, local rank ``SLURM_LOCALID``, node ``SLURM_NODEID``;
    rendezvous on the first host of ``SLURM_JOB_NODELIST`` (or ``MASTER_ADDR``) at ``MASTER_PORT`` or
    ``10000 + SLURM_JOB_ID % 1000``. Interactive allocations (job name ``bash``/``interactive``) do not count:
    there taskfit launches its processes itself."""

    name = "slurm"
    creates_processes_externally = True

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or first_host(os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1"))

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        return 10000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000

    def world_size(self) -> int:
        return int(os.environ["SLURM_NTASKS"])

    def global_rank(self) -> int:
        return int(os.environ["SLURM_PROCID"])

    def local_rank(self) -> int:
        return int(os.environ["SLURM_LOCALID"])

    def node_rank(self) -> int:
        return int(os.environ.get("SLURM_NODEID", "0"))
