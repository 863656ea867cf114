"""PyTorch/XLA data parallel (``strategy="xla"``; F-STRAT-5): one replica per XLA device, gradients all-reduced
with ``xm.reduce_gradients`` before clipping and stepping, the lazy graph cut (``torch_xla.sync``, formerly
``xm.mark_step``) once per optimizer step, and checkpoints moved to the CPU before saving. Mirrors Lightning's
``XLAStrategy`` / ``SingleDeviceXLAStrategy`` and the HF Trainer's TPU path (``xm.optimizer_step``).

torch_xla is imported lazily; without it every entry point raises ``ModuleNotFoundError`` naming the extra
(``pip install 'taskfit[xla]'``).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from taskfit.accelerators.accelerator import Accelerator
from taskfit.accelerators.xla import require_torch_xla
from taskfit.io.checkpoint_io import CheckpointIO
from taskfit.precision.precision import Precision
from taskfit.precision.xla import XLAPrecision
from taskfit.strategies.settings import StrategySettings
from taskfit.strategies.strategy import Strategy


def _sync() -> None:
    """Cut and run the pending lazy graph (``torch_xla.sync()``; ``xm.mark_step()`` on older torch_xla)."""
    import torch_xla

    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:  # pragma: no cover - torch_xla < 2.6
        import torch_xla.core.xla_model as xm

        xm.mark_step()


def to_cpu(obj: Any) -> Any:
    """Every tensor of a (nested) collection copied to the CPU (XLA-aware checkpoint IO: XLA tensors cannot be
    pickled by ``torch.save``; SPMD-sharded tensors are gathered whole by ``.cpu()``)."""
    return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().cpu())


class XLAStrategy(Strategy):
    """Data parallel over XLA replicas, or one XLA device.

    Args:
        accelerator (Accelerator): the XLA accelerator.
        devices (list[torch.device]): one ``xla`` device per replica.
        precision (Precision): numerics plugin (``16-mixed`` is refused by the plugin on XLA: use ``bf16-mixed``).
        checkpoint_io (CheckpointIO | None): storage plugin; checkpoints reach it with CPU tensors only.
        num_nodes (int): hosts (PJRT discovers the topology itself).
        settings (StrategySettings | None): the strategy family's settings (:class:`XLAFSDPStrategy`'s).

    Raises:
        ModuleNotFoundError: torch_xla is missing (names the extra).
        ValueError: several replicas asked for in a process that was not started by a launcher: taskfit does
            not spawn XLA replicas itself; launch with ``torchrun --nproc_per_node=N`` (or ``xmp.spawn``).
    """

    name = "xla"
    precision_plugin = XLAPrecision
    parallel = True  # the connector passes devices=, num_nodes= and settings=

    def __init__(self, accelerator: Accelerator, devices: list[torch.device], precision: Precision,
                 checkpoint_io: CheckpointIO | None = None, num_nodes: int = 1,
                 settings: StrategySettings | None = None) -> None:
        require_torch_xla(f"strategy={self.name!r}")
        launched = "WORLD_SIZE" in os.environ or "TASKFIT_LAUNCHED" in os.environ
        if len(devices) > 1 and not launched:
            raise ValueError(f"strategy={self.name!r} with {len(devices)} XLA devices needs one process per device, "
                             "and taskfit does not spawn XLA replicas itself: launch the script with torchrun "
                             f"--nproc_per_node={len(devices)} (PJRT reads its environment), or use devices=1.")
        super().__init__(accelerator, devices[0], precision, checkpoint_io)
        self.devices, self.num_nodes = list(devices), int(num_nodes)
        if settings is not None:
            self.settings = settings
        self._grads_reduced = False

    # -- topology (PJRT) --------------------------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        import torch_xla.runtime as xr

        return int(xr.global_ordinal())

    @property
    def local_rank(self) -> int:
        import torch_xla.runtime as xr

        return int(xr.local_ordinal())

    @property
    def world_size(self) -> int:
        import torch_xla.runtime as xr

        return int(xr.world_size())

    # -- set-up -----------------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Configure PJRT (``PJRT_DEVICE``) and take this process's XLA device (``torch_xla.device()``)."""
        self.accelerator.setup_device(self.root_device)
        import torch_xla

        self.root_device = torch_xla.device()

    def process_dataloader(self, dataloader: Any) -> Any:
        """Give each replica its share of a map-style loader (several replicas only)."""
        if self.world_size == 1:
            return dataloader
        from taskfit.data.loaders import distributed_loader

        return distributed_loader(dataloader, self.world_size, self.global_rank)

    # -- step -------------------------------------------------------------------------------------------
    def _reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.world_size > 1 and not self._grads_reduced:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)  # mean over replicas, as xm.optimizer_step
        self._grads_reduced = True

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """All-reduce the gradients over replicas first, then clip their global L2 norm to ``max_norm``."""
        self._reduce_gradients(optimizer)
        return super().clip_gradients(parameters, max_norm, optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None, **kwargs: Any) -> bool:
        """``xm.optimizer_step`` split in its parts: reduce gradients (once per step), step through the precision
        plugin, then cut the lazy graph so the step runs (``torch_xla.sync``). A ``closure`` runs once first (its
        gradients must be reduced before the step); ``kwargs`` reach ``optimizer.step``."""
        if closure is not None:
            closure()
        self._reduce_gradients(optimizer)
        ok = self.precision.optimizer_step(optimizer, **kwargs)
        self._grads_reduced = False
        _sync()
        return ok

    # -- collectives ------------------------------------------------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """``xm.all_reduce`` over replicas with ``op`` in ``"mean"``/``"sum"``/``"max"``/``"min"``.

        Raises:
            ValueError: an unknown ``op`` (names the valid choices).
        """
        ops = ("mean", "sum", "max", "min")
        if op not in ops:
            raise ValueError(f"Unknown reduce op {op!r}; valid choices: {', '.join(ops)}.")
        if self.world_size == 1:
            return tensor
        import torch_xla.core.xla_model as xm

        kind = {"mean": xm.REDUCE_SUM, "sum": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}[op]
        out = xm.all_reduce(kind, tensor.to(self.root_device))
        return out / self.world_size if op == "mean" else out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every replica along a new first dimension (``xm.all_gather``)."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        import torch_xla.core.xla_model as xm

        return xm.all_gather(tensor.to(self.root_device).unsqueeze(0), dim=0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Send a picklable ``obj`` from replica ``src`` to all (pickled bytes summed over replicas, zeros
        elsewhere, as Lightning's ``XLAStrategy.broadcast``)."""
        if self.world_size == 1:
            return obj
        import torch_xla.core.xla_model as xm

        mine = self.global_rank == src
        data = pickle.dumps(obj) if mine else b""
        size = xm.all_reduce(xm.REDUCE_SUM, torch.tensor([len(data)], device=self.root_device))
        n = int(size.cpu().item())
        buf = torch.zeros(n, dtype=torch.int32)
        if mine:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int32)
        out = xm.all_reduce(xm.REDUCE_SUM, buf.to(self.root_device)).cpu().to(torch.uint8)
        return pickle.loads(out.numpy().tobytes())

    def barrier(self, name: str | None = None) -> None:
        """``xm.rendezvous(name)`` across replicas."""
        if self.world_size > 1:
            import torch_xla.core.xla_model as xm

            xm.rendezvous(name or "barrier")

    # -- checkpoints (XLA-aware: tensors moved to the CPU first) ----------------------------------------
    def model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The state dict of ``module`` with every tensor on the CPU (after running pending XLA work)."""
        _sync()
        return to_cpu(module.state_dict())

    def save_checkpoint(self, folder: str, files: dict[str, Any], module: torch.nn.Module | None = None,
                        optimizers: Sequence[Any] = (), *, plan: Any = None) -> str:
        """Run pending XLA work, then write as every strategy does (device tensors in ``files`` reach the files on
        the CPU)."""
        _sync()
        return super().save_checkpoint(folder, to_cpu(files), module, optimizers, plan=plan)

    def teardown(self) -> None:
        """Run pending XLA work, then release IO and the device."""
        if self.root_device.type == "xla":
            _sync()
        super().teardown()
