"""The strategy interface: placement and communication (DESIGN.md). Owns the accelerator, precision plugin
and checkpoint IO. Mirrors Lightning's ``Strategy``."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from taskfit.accelerators.accelerator import Accelerator
from taskfit.io.checkpoint_io import CheckpointIO, TorchCheckpointIO
from taskfit.precision.precision import Precision


class Strategy:
    """Base strategy for one process; distributed strategies override the communication methods.

    Args:
        accelerator (Accelerator): the device kind.
        device (torch.device): the device of this process.
        precision (Precision): numerics plugin.
        checkpoint_io (CheckpointIO | None): storage plugin; ``TorchCheckpointIO`` when None.
    """

    name = "base"

    def __init__(self, accelerator: Accelerator, device: torch.device, precision: Precision,
                 checkpoint_io: CheckpointIO | None = None) -> None:
        self.accelerator = accelerator
        self.root_device = device
        self.precision = precision
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self.model: torch.nn.Module | None = None

    # -- process topology -------------------------------------------------------------------------------
    @property
    def global_rank(self) -> int:
        """Index of this process among all processes (0-based)."""
        return 0

    @property
    def local_rank(self) -> int:
        """Index of this process on its machine (0-based)."""
        return 0

    @property
    def node_rank(self) -> int:
        """Index of this machine (0-based)."""
        return 0

    @property
    def world_size(self) -> int:
        """Number of processes taking part."""
        return 1

    @property
    def is_global_zero(self) -> bool:
        """True on the process with global rank 0."""
        return self.global_rank == 0

    # -- set-up -----------------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Prepare this process's device (and, in subclasses, the process group)."""
        self.accelerator.setup_device(self.root_device)

    def setup(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert ``module`` to the plugin's dtype and move it to this process's device; returns it.

        Distributed strategies return a wrapper (DDP, FSDP, DeepSpeed engine) here.
        """
        module = self.precision.convert_module(module)
        self.model = module.to(self.root_device)
        return self.model

    def process_dataloader(self, dataloader: Any) -> Any:
        """Hook to wrap or re-shard a DataLoader (distributed samplers, XLA loaders). Identity here."""
        return dataloader

    def step_function(self, module: torch.nn.Module, name: str) -> Any:
        """The callable the loops use for ``module.<name>`` (``"training_step"``, ...): the method itself here;
        wrapping strategies route it through the wrapper's ``forward``."""
        return getattr(module, name)

    def batch_to_device(self, batch: Any) -> Any:
        """Move every tensor of ``batch`` to this process's device (non-blocking from pinned memory)."""
        device = self.root_device
        if device.type != "cpu":  # CPU tensors are already in place: skip the tree walk on the hot path
            batch = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device, non_blocking=True))
        return self.precision.convert_input(batch)

    # -- step -------------------------------------------------------------------------------------------
    def forward_context(self) -> ContextManager:
        """Context for forward passes (precision autocast; on MPS a missing operator is re-raised with the
        ``PYTORCH_ENABLE_MPS_FALLBACK=1`` hint)."""
        if self.root_device.type == "mps":
            stack = contextlib.ExitStack()
            stack.enter_context(self.accelerator.missing_op_hint())
            stack.enter_context(self.precision.forward_context("mps"))
            return stack
        return self.precision.forward_context(self.root_device.type)

    def no_sync(self, micro_batch_is_last: bool) -> ContextManager:
        """Skip gradient synchronisation on non-final micro-batches of an accumulation window (DDP ``no_sync``)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate a scalar ``loss`` through the precision plugin."""
        self.precision.backward(loss)

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Unscale, then clip the global L2 norm of ``parameters``' gradients to ``max_norm``.

        Returns the total norm before clipping as a 0-dim tensor (no host sync). Mirrors
        ``torch.nn.utils.clip_grad_norm_``; sharded strategies compute the norm across shards.
        """
        self.precision.unscale_gradients(optimizer)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer`` through the precision plugin; False when the step was skipped."""
        return self.precision.optimizer_step(optimizer)

    # -- collectives (identity for one process) ---------------------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce ``tensor`` over all processes with ``op`` in ``"mean"``/``"sum"``/``"max"``/``"min"``."""
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every process along a new first dimension of size ``world_size``."""
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Send a picklable ``obj`` from rank ``src`` to every process."""
        return obj

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point."""

    # -- checkpoints ------------------------------------------------------------------------------------
    def model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded, unwrapped) state dict of ``module``."""
        return module.state_dict()

    def save_checkpoint_shards(self, module: torch.nn.Module, optimizer: Any, folder: str) -> list[str] | None:
        """Sharded strategies (FSDP, DeepSpeed): write this rank's model and optimizer shards into the local
        checkpoint ``folder`` (which exists on every rank when this is called) and return the file names written,
        relative to ``folder`` (they go into the manifest). None (here): not sharded, rank 0 writes the full
        ``model.safetensors`` and ``optimizer.pt`` instead."""
        return None

    def load_checkpoint_shards(self, module: torch.nn.Module, optimizer: Any, folder: str,
                               names: list[str], reader: Any = None) -> bool:
        """Restore model and optimizer from the shard files ``names`` of checkpoint ``folder``; True when restored.
        ``reader`` (a :class:`~taskfit.io.checkpoint_format.CheckpointReader` of ``folder``) verifies each file
        against the manifest on the bytes that are loaded (one read per file); built here when None. Here (one
        full copy of the model per process: single device, DDP): FSDP's ``torch.distributed.checkpoint`` shards
        (``shards/.metadata``) are converted to one full state dict (any saved world size) and loaded. Return
        False when ``names`` is empty or holds nothing this strategy reads; the full ``model.safetensors``/
        ``optimizer.pt`` are loaded then.

        Raises:
            ValueError: shards that do not match ``module`` / ``optimizer`` (names the keys).
            CheckpointError: a shard is missing or corrupted. UnsafeCheckpointError: it needs arbitrary unpickling.
        """
        from taskfit.io.checkpoint_format import CheckpointReader
        from taskfit.strategies.checkpoint_shards import (
            is_dcp_checkpoint, load_full_into, local_folder, read_full_state_dict, verified_shard_bytes,
        )

        if not is_dcp_checkpoint(names):
            return False
        reader = reader or CheckpointReader(self.checkpoint_io, folder)
        state = read_full_state_dict(local_folder(self.checkpoint_io, folder), verified_shard_bytes(reader),
                                     reader.weights_only)
        load_full_into(module, optimizer, state)
        return True

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str) -> None:
        """Write ``checkpoint`` from rank zero through the checkpoint IO plugin."""
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: str, weights_only: bool = True) -> dict[str, Any]:
        """Read a checkpoint through the checkpoint IO plugin onto the CPU."""
        return self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)

    def teardown(self) -> None:
        """Release the device, background IO and (in subclasses) the process group."""
        self.checkpoint_io.teardown()
        self.accelerator.teardown()
