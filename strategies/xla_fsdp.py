"""PyTorch/XLA FSDP (``strategy="xla_fsdp"``; F-STRAT-5): ``XlaFullyShardedDataParallel`` over XLA replicas, or
with ``fsdp_config={"xla_fsdp_v2": True}`` the SPMD ``SpmdFullyShardedDataParallel`` (FSDPv2) in one process over
a ``("fsdp", "tensor")`` mesh of every device. Mirrors the HF Trainer's XLA FSDP path (``fsdp_config`` keys
``xla``, ``xla_fsdp_settings``, ``xla_fsdp_grad_ckpt``, ``xla_fsdp_v2``) and Lightning's ``XLAFSDPStrategy``."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from taskfit.accelerators.accelerator import Accelerator
from taskfit.io.checkpoint_io import CheckpointIO
from taskfit.precision.precision import Precision
from taskfit.strategies.settings import XLAFSDPSettings
from taskfit.strategies.wrapper import StepForward
from taskfit.strategies.xla import XLAStrategy, _sync, to_cpu


class XLAFSDPStrategy(XLAStrategy):
    """Shard parameters, gradients and optimizer state over XLA devices.

    Args:
        accelerator, devices, precision, checkpoint_io, num_nodes: as :class:`XLAStrategy`.
        settings (XLAFSDPSettings | None): ``fsdp_config`` (read by the connector: dict, JSON or path, ``fsdp_``
            prefixes allowed) with
            ``xla_fsdp_settings`` (dict: keyword arguments of ``XlaFullyShardedDataParallel``, e.g.
            ``{"compute_dtype": "bfloat16", "flatten_parameters": False}``; dtype names are converted),
            ``xla_fsdp_grad_ckpt`` (bool: gradient checkpointing of every wrapped layer), ``xla_fsdp_v2`` (bool:
            SPMD FSDPv2), ``transformer_layer_cls_to_wrap`` (list[str]) or ``min_num_params`` (int) for auto-wrap;
            and the ``devices`` option as given.

    Raises:
        ModuleNotFoundError: torch_xla is missing (names the extra).
        ValueError: an unknown ``fsdp_config`` key, ``xla_fsdp_settings`` that is not a dict, ``xla_fsdp_v2``
            with several processes (FSDPv2 is single-process SPMD).
    """

    name = "xla_fsdp"
    shards_parameters = True
    settings_type = XLAFSDPSettings
    settings: XLAFSDPSettings

    def __init__(self, accelerator: Accelerator, devices: list[torch.device], precision: Precision,
                 checkpoint_io: CheckpointIO | None = None, num_nodes: int = 1,
                 settings: XLAFSDPSettings | None = None) -> None:
        settings = settings if settings is not None else XLAFSDPSettings()
        cfg = settings.fsdp_config
        self.v2 = bool(cfg.get("xla_fsdp_v2", False))
        fsdp_kwargs = cfg.get("xla_fsdp_settings") or {}
        if not isinstance(fsdp_kwargs, dict):
            raise ValueError(f"fsdp_config 'xla_fsdp_settings' must be a dict of XlaFullyShardedDataParallel "
                             f"arguments; got {type(fsdp_kwargs).__name__}.")
        if self.v2 and len(devices) > 1 and settings.devices in ("auto", None, -1, "-1"):
            devices = devices[:1]  # devices="auto": the one SPMD process uses every device of the host
        if self.v2 and len(devices) > 1:
            raise ValueError("fsdp_config xla_fsdp_v2=True (SPMD FSDPv2) runs in one process over every device "
                             f"of the host; devices={len(devices)} asks for several processes: use devices=1.")
        super().__init__(accelerator, devices, precision, checkpoint_io, num_nodes, settings)
        #: keyword arguments of ``XlaFullyShardedDataParallel`` (``xla_fsdp_settings``, dtype names converted)
        self.fsdp_kwargs = {k: getattr(torch, v) if k.endswith("_dtype") and isinstance(v, str) else v
                            for k, v in fsdp_kwargs.items()}
        self.grad_ckpt = bool(cfg.get("xla_fsdp_grad_ckpt", False))
        self.layer_names = cfg.get("transformer_layer_cls_to_wrap") or []
        if isinstance(self.layer_names, str):
            self.layer_names = [self.layer_names]
        self.min_num_params = int(cfg.get("min_num_params") or 0)
        self.mesh: Any = None

    def setup_environment(self) -> None:
        """FSDPv2: switch PJRT to SPMD (``xr.use_spmd()``, before any XLA tensor exists) and set the global
        ``("fsdp", "tensor")`` mesh of shape ``(devices, 1)`` as HF does; then take the XLA device."""
        if self.v2:
            import numpy as np
            import torch_xla.distributed.spmd as xs
            import torch_xla
            import torch_xla.runtime as xr

            self.accelerator.setup_device(self.root_device)
            if torch_xla._XLAC._xla_get_spmd_config_is_locked() and not xr.is_spmd():
                # use_spmd() would then force SPMD onto a started runtime, which crashes (SIGSEGV) on the CPU
                raise RuntimeError("fsdp_config xla_fsdp_v2=True needs SPMD mode before the XLA runtime starts, "
                                   "but it already started: set XLA_USE_SPMD=1 in the environment, or call "
                                   "torch_xla.runtime.use_spmd() at the top of the script.")
            xr.use_spmd()
            n = xr.global_runtime_device_count()
            self.mesh = xs.Mesh(np.arange(n), (n, 1), ("fsdp", "tensor"))
            xs.set_global_mesh(self.mesh)
        super().setup_environment()

    def _auto_wrap_policy(self, module: torch.nn.Module) -> Callable[..., Any] | None:
        from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.layer_names:
            classes = {type(m) for m in module.modules() if type(m).__name__ in self.layer_names}
            missing = set(self.layer_names) - {c.__name__ for c in classes}
            if missing:
                raise ValueError(f"fsdp_config transformer_layer_cls_to_wrap names {sorted(missing)}, which "
                                 f"{type(module).__name__} does not contain.")
            return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
        if self.min_num_params > 0:
            return functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params)
        return None

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert and move ``module`` to the XLA device, then wrap ``StepForward(module)`` in
        ``XlaFullyShardedDataParallel`` (or ``SpmdFullyShardedDataParallel`` for FSDPv2), with auto-wrap and
        per-layer gradient checkpointing (``xla_fsdp_grad_ckpt``) as configured. The wrapper deregisters the
        module's parameters: :meth:`setup_optimizers` points the run's optimizers at the shards."""
        from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel, checkpoint_module

        module = self.precision.convert_module(module).to(self.root_device)
        policy = self._auto_wrap_policy(module)
        if self.v2:
            from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDP

            kwargs: dict[str, Any] = {"mesh": self.mesh}
        else:
            # one shard per original parameter keeps the optimizer's groups (weight decay on/off) exact
            FSDP, kwargs = XlaFullyShardedDataParallel, {"flatten_parameters": False, **self.fsdp_kwargs}
        wrapper_callable = None
        if self.grad_ckpt:
            def wrapper_callable(m: torch.nn.Module, *a: Any, **kw: Any) -> torch.nn.Module:
                return FSDP(checkpoint_module(m), *a, **kw)
        return FSDP(StepForward(module), auto_wrap_policy=policy, auto_wrapper_callable=wrapper_callable, **kwargs)

    def setup_optimizers(self, module: torch.nn.Module, optimizers: list[Any]) -> list[Any]:
        """Replace the original parameters in ``optimizers`` by their shards (FSDPv2 shards in place: nothing to
        do)."""
        if not self.v2:
            for optimizer in optimizers:
                self._remap_optimizer(optimizer)
        return optimizers

    def _remap_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Replace every original parameter in ``optimizer`` by its shard (``p._sharded_param``), keeping its
        group; state already loaded for the full parameter (a resumed run) becomes the shard's state.

        Raises:
            ValueError: ``flatten_parameters=True`` (in ``xla_fsdp_settings``) with several parameter groups or
                resumed state: one flat shard mixes parameters of several groups.
            NotImplementedError: resumed optimizer state with several replicas (only one replica's part is here).
        """
        if any(not hasattr(p, "_sharded_param") for g in optimizer.param_groups for p in g["params"]):
            if len(optimizer.param_groups) != 1 or optimizer.state:
                raise ValueError("xla_fsdp_settings flatten_parameters=True merges parameters of several optimizer "
                                 "groups (e.g. weight decay on/off) into one flat shard: set flatten_parameters "
                                 "to False (taskfit's default), or use one parameter group and no resumed state.")
            optimizer.param_groups[0]["params"] = list(self.model.parameters())
            return
        for group in optimizer.param_groups:
            new = []
            for p in group["params"]:
                shard = p._sharded_param
                state = optimizer.state.pop(p, None)
                if state:
                    if self.world_size > 1:
                        raise NotImplementedError("Resuming XLA-FSDP optimizer state with several replicas is not "
                                                  "supported; resume on one replica or without optimizer state.")
                    # one replica: the shard is the flattened parameter, zero-padded
                    optimizer.state[shard] = {
                        k: torch.nn.functional.pad(v.reshape(-1).to(shard.device), (0, shard.numel() - v.numel()))
                        .view_as(shard) if isinstance(v, torch.Tensor) and v.shape == p.shape and v.dim() > 0
                        else v for k, v in state.items()}
                new.append(shard)
            group["params"] = new

    def step_function(self, module: torch.nn.Module, name: str) -> Callable[..., Any]:
        """``module.<name>`` routed through the FSDP wrapper's ``forward`` (which gathers the shards)."""
        if module is not self._module or self.model is None:
            return getattr(module, name)
        model = self.model
        return lambda *args: model(name, *args)

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Clip the global gradient norm: ``XlaFullyShardedDataParallel.clip_grad_norm_`` across shards; under
        FSDPv2 the SPMD tensors are global, so ``torch.nn.utils.clip_grad_norm_`` is exact."""
        if not self.v2 and hasattr(self.model, "clip_grad_norm_"):
            return self.model.clip_grad_norm_(max_norm)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> bool:
        """Step (FSDP already reduce-scattered the gradients in backward), then cut the lazy graph; ``closure``
        and ``kwargs`` as :meth:`Strategy.optimizer_step`."""
        ok = self.precision.optimizer_step(optimizer, closure, **kwargs)
        _sync()
        return ok

    def model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict with single-device keys on the CPU: FSDPv2 parameters are global SPMD tensors
        (``.cpu()`` gathers them); ``XlaFullyShardedDataParallel`` shards are gathered from every replica
        (``xm.all_gather`` of the flat shards via ``consolidate_sharded_state_dicts``)."""
        _sync()
        if self.v2 or self.model is None:
            return to_cpu(module.state_dict())
        import torch_xla.core.xla_model as xm
        from torch_xla.distributed.fsdp import consolidate_sharded_state_dicts

        shard = {"model": to_cpu(self.model.state_dict()), "shard_metadata": self.model.get_shard_metadata()}
        shards = [shard] if self.world_size == 1 else xm.mesh_reduce("taskfit_xla_fsdp_state", shard, lambda s: s)
        full = consolidate_sharded_state_dicts([s["model"] for s in shards], shards[0]["shard_metadata"])
        return {k[len("module."):] if k.startswith("module.") else k: v for k, v in full.items()}
