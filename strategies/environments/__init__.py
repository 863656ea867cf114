"""Cluster environments and their detection (``torchrun`` / DeepSpeed launcher / taskfit's launcher, SLURM, local),
and elastic restarts (``torchrun --max-restarts``, SLURM requeue)."""

from __future__ import annotations

from taskfit.strategies.environments.base import ClusterEnvironment, LocalEnvironment, find_free_port
from taskfit.strategies.environments.restarts import Restart, elastic_restart
from taskfit.strategies.environments.slurm import SLURMEnvironment
from taskfit.strategies.environments.torchelastic import TorchElasticEnvironment


def detect_environment(num_processes: int, num_nodes: int = 1) -> ClusterEnvironment:
    """The environment this process runs in: the ``env://`` variables (torchrun, DeepSpeed's launcher, taskfit's
    own) win, then SLURM, else a :class:`LocalEnvironment` where taskfit launches ``num_processes`` itself."""
    for env in (TorchElasticEnvironment, SLURMEnvironment):
        if env.detect():
            return env()
    return LocalEnvironment(num_processes, num_nodes)


__all__ = ["ClusterEnvironment", "LocalEnvironment", "Restart", "SLURMEnvironment", "TorchElasticEnvironment",
           "detect_environment", "elastic_restart", "find_free_port"]
