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


def launcher_mismatch(devices: object, num_devices: int, num_nodes: int, strategy: str, parallel: bool) -> str | None:
    """A warning when an external launcher (torchrun, SLURM, DeepSpeed's) started another number of processes than
    the code's explicit ``devices`` x ``num_nodes`` asks for, saying which one wins; None when they agree,
    ``devices`` was left to ``"auto"`` (then the launcher decides, as intended) or on ranks other than 0. Lightning
    raises on the same mismatch (``TorchElasticEnvironment.validate_settings``); taskfit runs on and says what
    happens.

    Args:
        devices (object): the ``devices`` option as the user gave it (``"auto"``/None: not explicit).
        num_devices (int): the devices it resolved to on this node.
        num_nodes (int): the ``num_nodes`` option.
        strategy (str): the strategy's name.
        parallel (bool): whether the strategy runs several processes as one run.
    """
    if devices in (None, "auto") or num_devices < 1:
        return None
    env = detect_environment(num_devices, num_nodes)
    if not env.creates_processes_externally:
        return None
    world, asked = env.world_size(), num_devices * num_nodes
    if world == asked or env.global_rank() != 0:  # said once, by global rank 0
        return None
    head = (f"{env.name} started {world} process(es) (world size {world}), but the code asks for devices={devices!r}"
            f" x num_nodes={num_nodes} = {asked}: ")
    if parallel:
        return head + (f"the launcher wins, strategy {strategy!r} trains the {world} processes as one run of world "
                       f"size {world}. Set devices='auto' (or the launcher's per-node count) to say so, or start "
                       f"{asked} process(es).")
    return head + (f"the code wins, strategy {strategy!r} trains each of the {world} processes as its own run "
                   "(world size 1, no gradient sync between them). Use strategy='ddp' with devices='auto' to train "
                   f"them as one run, or start {asked} process(es).")


__all__ = ["ClusterEnvironment", "LocalEnvironment", "Restart", "SLURMEnvironment", "TorchElasticEnvironment",
           "detect_environment", "elastic_restart", "launcher_mismatch", "find_free_port"]
