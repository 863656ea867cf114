"""What HF scripts ask the arguments object about the running process: ``world_size``, ``process_index``,
``local_process_index``, ``should_log``, ``should_save``, ``get_process_log_level()``, ``train_batch_size``,
``eval_batch_size``, ``n_gpu``, ``device``, ``parallel_mode`` and ``main_process_first()`` (the
:class:`RuntimeProperties` mixin of `FitArguments`; mirrors the same members of ``transformers.TrainingArguments``).

The values come from ``torch.distributed`` when a process group exists, else from the launcher's environment
(``WORLD_SIZE``/``RANK``/``LOCAL_RANK``, as torchrun, SLURM and DeepSpeed set them), else a single process.
"""

import contextlib
import enum
import logging
import os
from typing import Any

#: HF's ``trainer_log_levels``: Python levels by name, ``passive`` = -1 (keep the library's level).
LOG_LEVEL_VALUES = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                    "error": logging.ERROR, "critical": logging.CRITICAL, "passive": -1}


class ParallelMode(str, enum.Enum):
    """How the processes share the work (values of HF ``ParallelMode``; compares equal to the plain string)."""

    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    TPU = "tpu"


def _rank_env(name: str) -> str | None:
    """The launcher's rank variable ``name``: from the environment, else held back by taskfit's script launcher
    until the worker's ``launch()`` (``taskfit.strategies.environments.held``, above this package: read here by
    its variable name) so that a worker knows its rank before the process group exists."""
    value = os.environ.get(name)
    if value is None and os.environ.get("TASKFIT_RANK_ENV"):
        import json

        value = json.loads(os.environ["TASKFIT_RANK_ENV"]).get(name)
    return value


def _group() -> Any:
    """``torch.distributed`` when a process group is initialised, else None (torch imported lazily)."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class RuntimeProperties:
    """Process and device facts of the current run, by HF ``TrainingArguments``' names (see the module doc)."""

    @property
    def world_size(self) -> int:
        """Number of processes of the job: the process group's size, else ``$WORLD_SIZE``, else 1."""
        group = _group()
        return group.get_world_size() if group else int(_rank_env("WORLD_SIZE") or 1)

    @property
    def process_index(self) -> int:
        """Global rank of this process (0 on a single process)."""
        group = _group()
        return group.get_rank() if group else int(_rank_env("RANK") or 0)

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node: ``$LOCAL_RANK``, else ``local_rank`` when >= 0, else the global rank
        on one node (0 on a single process)."""
        if _rank_env("LOCAL_RANK") is not None:
            return int(_rank_env("LOCAL_RANK"))
        if getattr(self, "local_rank", -1) >= 0:
            return int(self.local_rank)
        return self.process_index if self.world_size > 1 and getattr(self, "num_nodes", 1) == 1 else 0

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the first process of each node with ``log_on_each_node``, else rank 0."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: the first of each node with ``save_on_each_node``, else rank 0."""
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    def get_process_log_level(self) -> int:
        """Python log level for this process: ``log_level`` where :attr:`should_log`, else ``log_level_replica``;
        ``"passive"`` keeps the current level of the ``transformers`` logger (WARNING unless changed), as HF does.

        Returns:
            int: a ``logging`` level such as ``logging.INFO`` (20).
        """
        name = (self.log_level if self.should_log else self.log_level_replica) or "passive"
        level = LOG_LEVEL_VALUES[name]
        return logging.getLogger("transformers").getEffectiveLevel() if level == -1 else level

    def _device_kind(self) -> str:
        """The accelerator this process would use: ``"cpu"`` with ``use_cpu``, else :func:`choose_accelerator`'s
        pick for ``accelerator`` (``"gpu"`` without CUDA or MPS falls back to the CPU, as a description)."""
        from taskfit.accelerators import choose_accelerator

        if self.use_cpu:
            return "cpu"
        try:
            return choose_accelerator(str(getattr(self, "accelerator", "auto")))[0]
        except ValueError:
            return "cpu"

    @property
    def n_gpu(self) -> int:
        """GPUs this process drives: 0 off CUDA, 1 on CUDA (taskfit runs one device per process, except
        ``strategy='dp'`` which drives every visible GPU)."""
        from taskfit.accelerators import CUDAAccelerator

        per_process = {"cuda": 1}.get(self._device_kind(), 0)
        if per_process and str(getattr(self, "strategy", "auto")) == "dp":
            return CUDAAccelerator.auto_device_count()
        return per_process

    @property
    def train_batch_size(self) -> int:
        """Training samples per step of this process: ``per_device_train_batch_size * max(1, n_gpu)`` (HF)."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Evaluation samples per batch of this process: ``per_device_eval_batch_size * max(1, n_gpu)`` (HF)."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def device(self) -> Any:
        """The ``torch.device`` of this process: the CPU with ``use_cpu``/``accelerator='cpu'`` or when no other
        device exists, else the accelerator's device (``cuda:<local rank>``, ``mps``), chosen as ``Fit`` does."""
        import torch

        from taskfit.accelerators import CUDAAccelerator

        kind = self._device_kind()
        index = {"cuda": lambda: self.local_process_index % max(1, CUDAAccelerator.auto_device_count())}.get(kind)
        return torch.device(kind) if index is None else torch.device(kind, index())

    @property
    def ddp_timeout_delta(self) -> Any:
        """``ddp_timeout`` as a ``datetime.timedelta`` (what ``init_process_group`` takes; HF's property)."""
        import datetime

        return datetime.timedelta(seconds=self.ddp_timeout if self.ddp_timeout is not None else 1800)

    @property
    def parallel_mode(self) -> ParallelMode:
        """``DISTRIBUTED`` with several processes, ``NOT_DISTRIBUTED`` for one process on several GPUs
        (``strategy='dp'``), ``TPU`` on XLA, else ``NOT_PARALLEL``."""
        if self._device_kind() in ("xla", "tpu"):
            return ParallelMode.TPU
        if self.world_size > 1:
            return ParallelMode.DISTRIBUTED
        return ParallelMode.NOT_DISTRIBUTED if self.n_gpu > 1 else ParallelMode.NOT_PARALLEL

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Any:
        """Context manager: the main process (``local``: the first of each node, else global rank 0) runs the
        block first, e.g. to tokenise and cache a dataset, and the others wait at a barrier, then run it (reading
        the cache). Under torchrun (or SLURM/DeepSpeed launchers exporting ``RANK``/``WORLD_SIZE``) it forms the
        process group if needed; in a plain ``python train.py`` run the block runs before taskfit launches the other
        processes, which then run it after the main one. Mirrors HF ``TrainingArguments.main_process_first``.

        Args:
            local (bool): per node (True) or once for the whole job (False).
            desc (str): what the block does, for the log message of the waiting processes.
        """
        import torch.distributed as dist

        launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        if dist.is_available() and not dist.is_initialized() and launched and int(os.environ["WORLD_SIZE"]) > 1:
            # torchrun & co. started the processes: form the group now (Fit's strategy then reuses it)
            import datetime

            from taskfit.accelerators import CUDAAccelerator

            backend = self.ddp_backend or ("nccl" if CUDAAccelerator.is_available() else "gloo")
            dist.init_process_group(backend, init_method="env://",
                                    timeout=datetime.timedelta(seconds=float(self.ddp_timeout or 1800)))
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            yield  # one process, or taskfit's own launcher has not started the others yet (they run it later)
            return
        rank = int(os.environ.get("LOCAL_RANK", dist.get_rank())) if local else dist.get_rank()
        if rank != 0:
            logging.getLogger("taskfit").debug("Waiting for the main process to finish %s first.", desc)
            dist.barrier()
        try:
            yield
        finally:
            if rank == 0:
                dist.barrier()
