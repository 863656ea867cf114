"""The base of every multi-process strategy: cluster environment, launching, the process group, collectives,
distributed sampling and step routing through the wrapper (mirrors Lightning's ``ParallelStrategy``).
DDP, FSDP and DeepSpeed subclass it and add their wrapping (``setup``) and checkpoint layout."""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from typing import Any, Callable

import torch
import torch.distributed as dist
from lightning_utilities.core.rank_zero import rank_zero_only

from taskfit.accelerators.accelerator import Accelerator
from taskfit.io.checkpoint_io import CheckpointIO
from taskfit.precision.precision import Precision
from taskfit.strategies.environments import ClusterEnvironment, TorchElasticEnvironment, detect_environment
from taskfit.strategies import process_group
from taskfit.strategies.launchers import MultiprocessingLauncher, SubprocessScriptLauncher, start_worker
from taskfit.strategies.process_group import destroy_process_group
from taskfit.strategies.settings import ProcessGroupSettings
from taskfit.strategies.strategy import Strategy

log = logging.getLogger("taskfit")
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN}


class DistributedError(RuntimeError):
    """A collective failed: another process died or did not answer within ``ddp_timeout``."""


class ParallelStrategy(Strategy):
    """Several processes, one device each, in one ``torch.distributed`` process group.

    Args:
        accelerator (Accelerator): the device kind.
        devices (list[torch.device]): this node's devices (one process each; on CPU, ``devices=2`` means 2 processes).
        precision (Precision): numerics plugin.
        checkpoint_io (CheckpointIO | None): storage plugin.
        num_nodes (int): machines.
        settings (ProcessGroupSettings | None): ``backend`` (default gloo on CPU, nccl on CUDA), ``timeout``
            (seconds), and the strategy family's own settings (its :attr:`settings_type`); the connector applies
            the run's settings with :meth:`apply_settings`.
        start_method (str): ``"popen"`` re-runs the script in worker processes (like torchrun); ``"spawn"`` runs
            ``fit`` in ``torch.multiprocessing`` workers (``ddp_spawn``).
        cluster_environment (ClusterEnvironment | None): override the detected environment.
    """

    parallel = True
    settings_type = ProcessGroupSettings
    settings: ProcessGroupSettings

    def __init__(self, accelerator: Accelerator, devices: list[torch.device], precision: Precision,
                 checkpoint_io: CheckpointIO | None = None, num_nodes: int = 1,
                 settings: ProcessGroupSettings | None = None, start_method: str = "popen",
                 cluster_environment: ClusterEnvironment | None = None) -> None:
        self.devices, self.num_nodes, self.start_method = list(devices), int(num_nodes), start_method
        self.settings = settings if settings is not None else self.settings_type()
        self.num_processes = len(self.devices)
        self.cluster_environment = cluster_environment or detect_environment(self.num_processes, self.num_nodes)
        super().__init__(accelerator, self._device_for(self.cluster_environment.local_rank()), precision,
                         checkpoint_io)
        self.launcher: Any = None
        env = self.cluster_environment
        if not env.creates_processes_externally and env.world_size() > 1:
            if start_method == "popen":  # wait for the workers at most ddp_timeout plus a few seconds
                self.launcher = SubprocessScriptLauncher(self.num_processes, self.num_nodes, env.node_rank(),
                                                         env.main_address, env.main_port,
                                                         join_timeout=self.settings.timeout_s + 5.0)
            else:
                self.launcher = MultiprocessingLauncher(self.num_processes, self.num_nodes, env.node_rank(),
                                                        env.main_address, env.main_port)

    def apply_settings(self, settings: ProcessGroupSettings) -> None:
        """Take the run's settings (see :class:`Strategy`); the script launcher waits for its workers at most the
        collective timeout plus 5 s."""
        super().apply_settings(settings)
        if isinstance(self.launcher, SubprocessScriptLauncher):
            self.launcher.join_timeout = settings.timeout_s + 5.0

    def _device_for(self, local_rank: int) -> torch.device:
        if self.devices and self.devices[0].type != "cpu":
            return self.devices[local_rank % len(self.devices)]
        return self.devices[0] if self.devices else torch.device("cpu")

    # -- topology ---------------------------------------------------------------------------------------
    @property
    def env(self) -> ClusterEnvironment:
        """The cluster environment; switches to the launched workers' ``env://`` variables once they exist (this
        object may have been built before the launch, e.g. pickled into ``ddp_spawn`` workers)."""
        if not self.cluster_environment.creates_processes_externally and TorchElasticEnvironment.detect():
            self.cluster_environment = TorchElasticEnvironment()
        return self.cluster_environment

    @property
    def global_rank(self) -> int:
        return self.env.global_rank()

    @property
    def local_rank(self) -> int:
        return self.env.local_rank()

    @property
    def node_rank(self) -> int:
        return self.env.node_rank()

    @property
    def world_size(self) -> int:
        return self.env.world_size()

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on every process of the run (mirrors Lightning's launchers). Script launcher
        (``strategy="ddp"`` run as ``python train.py``): start the other ranks as copies of the script once, then
        run ``fn`` here as rank 0. Spawn launcher (``ddp_spawn``): run ``fn`` in freshly spawned workers and
        return rank 0's result (``fn`` and ``args`` must pickle). Launched externally (torchrun, SLURM) or already
        inside a worker: run ``fn`` here (a script launcher's worker first exports its held-back rank variables and
        takes the run's thread count, see ``launchers.start_worker``)."""
        launched = os.environ.get("TASKFIT_LAUNCHED")
        if isinstance(self.launcher, MultiprocessingLauncher) and not launched:
            return self.launcher.launch(fn, *args)
        if isinstance(self.launcher, SubprocessScriptLauncher) and not self.launcher.launched and not launched:
            self.launcher.launch()
        start_worker()  # a worker of the script launcher: its rank variables and thread count, from here on
        return fn(*args)

    # -- set-up -----------------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Start the other processes (when taskfit launches them) and join the process group.

        Raises:
            DistributedError: the process group could not be formed within ``ddp_timeout``.
        """
        start_worker()
        self.root_device = self._device_for(self.local_rank)
        rank_zero_only.rank = self.global_rank  # spawned workers start without it
        super().setup_environment()
        if not dist.is_initialized():
            env = self.env
            os.environ.setdefault("MASTER_ADDR", env.main_address)
            os.environ.setdefault("MASTER_PORT", str(env.main_port))
            timeout = datetime.timedelta(seconds=self.settings.timeout_s)
            try:
                dist.init_process_group(self.backend, init_method="env://", rank=env.global_rank(),
                                        world_size=env.world_size(), timeout=timeout)
            except Exception as exc:
                if isinstance(self.launcher, SubprocessScriptLauncher):
                    self.launcher.failed = True
                raise DistributedError(f"Could not form the process group ({env.describe()}, backend "
                                       f"{self.backend!r}): {exc}") from exc
            process_group.reset()
            log.info("Process group ready: %s, backend %s.", env.describe(), self.backend)
            atexit.register(destroy_process_group)

    @property
    def backend(self) -> str:
        """``ddp_backend``, else ``nccl`` on CUDA and ``gloo`` elsewhere."""
        chosen = self.settings.backend
        if chosen:
            return chosen
        return "nccl" if self.root_device.type == "cuda" else "gloo"

    def process_dataloader(self, dataloader: Any) -> Any:
        """Give this process its share of every map-style loader (see ``distributed_loader``)."""
        from taskfit.data.loaders import distributed_loader

        return distributed_loader(dataloader, self.world_size, self.global_rank)

    def step_function(self, module: torch.nn.Module, name: str) -> Callable[..., Any]:
        """``module.<name>`` routed through the wrapper's ``forward`` once ``setup`` wrapped it. The wrapper's
        forward may run collectives (DDP rebuilds its buckets on the second step, FSDP all-gathers shards), so a
        stopped or vanished peer there is a :class:`DistributedError` too."""
        model = self.model
        if model is None or module is not self._module or model is module:
            return getattr(module, name)
        what = f"{name} (the wrapper's forward collectives)"
        return lambda *args: self._check(what, lambda: model(name, *args))

    # -- collectives ------------------------------------------------------------------------------------
    def check_collective(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run the collective ``fn``; a communication failure (a peer stopped, vanished or timed out) becomes
        :class:`DistributedError` naming ``what`` and this rank, and marks the job failed (bounded exit); after
        such a failure every later collective raises at once, without waiting for the peer again.

        Raises:
            DistributedError: see above; other errors pass through unchanged.
        """
        return self._check(what, fn)

    def _check(self, what: str, fn: Callable[[], Any]) -> Any:
        if process_group.collective_failed:  # a peer is known gone: waiting ddp_timeout again would find nothing
            raise DistributedError(f"{what} skipped on rank {self.global_rank} of {self.world_size}: an earlier "
                                   "collective of this process failed (another process stopped or vanished).")
        try:
            return fn()
        except RuntimeError as exc:
            text = str(exc)
            if not (isinstance(exc, getattr(dist, "DistError", ())) or any(
                    k in text for k in ("gloo", "Gloo", "NCCL", "Connection", "connection", "timed out", "Timed out",
                                        "timeout", "pair closure"))):
                raise  # an ordinary error (e.g. in the user's backward), not a communication failure
            process_group.mark_failed()
            if isinstance(self.launcher, SubprocessScriptLauncher):
                self.launcher.failed = True  # at exit, do not wait long for workers that may be stuck
            raise DistributedError(
                f"{what} failed on rank {self.global_rank} of {self.world_size}: another process stopped or did not "
                f"answer within ddp_timeout={self.settings.timeout} s. Cause: {exc}") from exc

    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        if not dist.is_initialized() or self.world_size == 1:
            return tensor
        if op not in _REDUCE_OPS:
            raise ValueError(f"reduce op={op!r} is not valid; choose one of {sorted(_REDUCE_OPS)}.")
        out = tensor.detach().clone()
        self._check("all_reduce", lambda: dist.all_reduce(out, op=_REDUCE_OPS[op]))
        return out / self.world_size if op == "mean" else out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized() or self.world_size == 1:
            return tensor.unsqueeze(0)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._check("all_gather", lambda: dist.all_gather(parts, tensor.contiguous()))
        return torch.stack(parts)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized() or self.world_size == 1:
            return obj
        box = [obj]
        self._check("broadcast", lambda: dist.broadcast_object_list(box, src=src))
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized() and self.world_size > 1:
            self._check(f"barrier {name or ''}".strip(), dist.barrier)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._check("backward (gradient all-reduce)",
                    lambda: super(ParallelStrategy, self).backward(loss, *args, **kwargs))

    # the process group and the script launcher's workers outlive a stage: the next stage (``validate`` after
    # ``fit``) runs on them; both are released at exit (``destroy_process_group``, ``SubprocessScriptLauncher.join``)
