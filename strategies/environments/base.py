"""Cluster environments: where a process learns its rank, the world size and the rendezvous address
(mirrors Lightning's ``ClusterEnvironment``)."""

from __future__ import annotations

import os
import socket


def find_free_port() -> int:
    """A free TCP port on 127.0.0.1 (for the rendezvous of processes taskfit launches itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClusterEnvironment:
    """Rank and rendezvous information of this process.

    Attributes:
        creates_processes_externally (bool): True when a launcher outside taskfit (torchrun, the DeepSpeed
            launcher, SLURM's srun) started every process; False when taskfit must start them itself.
    """

    name = "base"
    creates_processes_externally = True

    @staticmethod
    def detect() -> bool:
        """Whether the current process runs under this environment."""
        raise NotImplementedError

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "29500"))

    def world_size(self) -> int:
        raise NotImplementedError

    def global_rank(self) -> int:
        raise NotImplementedError

    def local_rank(self) -> int:
        raise NotImplementedError

    def node_rank(self) -> int:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for the start summary."""
        return (f"{self.name}: rank {self.global_rank()}/{self.world_size()}, local rank {self.local_rank()}, "
                f"node {self.node_rank()}, rendezvous {self.main_address}:{self.main_port}")


class LocalEnvironment(ClusterEnvironment):
    """No launcher ran: taskfit starts the other processes of this node itself (``python train.py`` with
    ``Fit(strategy="ddp", devices=2)``); this process becomes local rank 0.

    Args:
        num_processes (int): processes per node.
        num_nodes (int): nodes; with more than one, ``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` must be set
            on every node.
    """

    name = "local"
    creates_processes_externally = False

    def __init__(self, num_processes: int, num_nodes: int = 1) -> None:
        self.num_processes, self.num_nodes = int(num_processes), int(num_nodes)
        self._port: int | None = None

    @staticmethod
    def detect() -> bool:
        return True

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        if self._port is None:
            self._port = find_free_port()
        return self._port

    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    def global_rank(self) -> int:
        return self.node_rank() * self.num_processes

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")))
