"""Fully Sharded Data Parallel on FSDP2 (``torch.distributed.fsdp.fully_shard``; ``strategy="fsdp"``/``"fsdp2"``,
HF ``fsdp="full_shard offload auto_wrap"`` + ``fsdp_config``; F-STRAT-4, F-PREC-3, F-CKPT-5). Mirrors Lightning's
``FSDPStrategy`` and the HF Trainer's / accelerate's FSDP options (see :mod:`taskfit.strategies.fsdp_options`).

Each parameter becomes a ``DTensor`` sharded over the processes. The TaskModule is wrapped as
``StepForward(module)`` (the root FSDP unit, so every step method runs through its forward hooks), and the
auto-wrapped layers become their own units, all-gathered one at a time. Checkpoints: every rank writes its shard
with ``torch.distributed.checkpoint`` under ``checkpoint-N/shards/`` (``state_dict_type="sharded"``, default), or
rank 0 writes the gathered full files (``"full"``); ``save_model`` always writes full, unsharded weights with the
keys of a single-device run.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ContextManager, Iterator

import torch
from torch import nn

from taskfit.precision.fsdp import FSDPPrecision, fsdp_mixed_precision_policy
from taskfit.strategies.checkpoint_shards import (
    is_dcp_checkpoint, local_folder, optimizer_state_by_index, optimizer_state_by_name, parameter_names,
    rank_file_names, shard_folder,
)
from taskfit.strategies.fsdp_options import SHARDING_STRATEGIES, FSDPOptions, resolve_fsdp_options
from taskfit.strategies.parallel import ParallelStrategy
from taskfit.strategies.settings import FSDPSettings
from taskfit.strategies.wrapper import StepForward

log = logging.getLogger("taskfit")
_NO_FORWARD = (nn.ModuleList, nn.ModuleDict)  # containers: fully_shard's hooks would never run on them


def _model_options(module: nn.Module) -> Any:
    """DCP state-dict options of a checkpoint's model shards: a PEFT model's frozen base is left out (the shards
    hold the trainable adapter, as accelerate's ``save_fsdp_model(adapter_only=True)`` for HF's Trainer), and
    loading leaves it as the rebuilt model has it; any other model whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from taskfit.io.peft_files import is_peft_model
    from taskfit.strategies.checkpointing import exportable_model

    if is_peft_model(exportable_model(module)):
        return StateDictOptions(ignore_frozen_params=True, strict=False)
    return None


def shard_like(full: Any, like: Any) -> Any:
    """``full`` (nested dicts of full tensors, present on every rank) cut into this rank's shards the way the
    matching entries of ``like`` are placed (``DTensor``: same mesh and placements; plain tensors: same dtype and
    device). Local slicing only, no collective (``distribute_tensor(src_data_rank=None)``)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, dict):
        return {k: shard_like(full[k], v) for k, v in like.items()}
    if isinstance(like, DTensor):
        t = full.to(dtype=like.dtype, device=like.to_local().device)
        return distribute_tensor(t, like.device_mesh, like.placements, src_data_rank=None)
    if isinstance(like, torch.Tensor) and isinstance(full, torch.Tensor):
        return full.to(dtype=like.dtype, device=like.device)
    return full


class FSDPStrategy(ParallelStrategy):
    """Shard parameters, gradients and optimizer state over the processes with FSDP2.

    Options come from the run's settings (:class:`~taskfit.strategies.settings.FSDPSettings`: the connector merges
    the ``fsdp`` words, ``fsdp_config``, ``fsdp_min_num_params``, ``fsdp_transformer_layer_cls_to_wrap`` and
    ``gradient_checkpointing`` (for the conflict check) with these keyword arguments, which win; see
    :class:`~taskfit.strategies.fsdp_options.FSDPOptions` for each):

    Args:
        sharding_strategy (str | None): ``full_shard`` | ``shard_grad_op`` | ``no_shard`` | ``hybrid_shard`` |
            ``hybrid_shard_zero2``.
        cpu_offload (bool | None): parameters, gradients and optimizer state on the CPU
            (``CPUOffloadPolicy``; unpinned memory on the CPU, where pinning needs an accelerator).
        transformer_layer_cls_to_wrap (str | type | list | None): auto-wrap by layer class (names or classes).
        min_num_params (int | None): auto-wrap by size (parameters).
        state_dict_type (str | None): ``"sharded"`` or ``"full"`` checkpoints.
        activation_checkpointing (bool | None): recompute each layer unit's activations in backward.
        device_mesh (tuple[int, int] | None): ``(replicate, shard)`` for the hybrid strategies.
        mixed_precision (torch.distributed.fsdp.MixedPrecisionPolicy | None): overrides the policy derived from
            the precision plugin (``bf16-mixed`` -> ``param_dtype=bfloat16, reduce_dtype=float32``; ``16-mixed``
            -> ``float16``/``float32``; others: none).
        **kwargs: other :class:`FSDPOptions` fields, then :class:`ParallelStrategy`'s arguments.

    Raises:
        ValueError: bad options (see ``resolve_fsdp_options``); at ``setup``: a layer class not in the model,
            ``activation_checkpointing`` without layer units, a ``device_mesh`` that does not multiply to the world
            size.
    """

    name = "fsdp"
    shards_parameters = True
    settings_type = FSDPSettings
    settings: FSDPSettings
    precision_plugin = FSDPPrecision
    max_optimizers = 1  # the sharded checkpoint (DCP) holds one optimizer's state

    def __init__(self, *args: Any, sharding_strategy: str | None = None, cpu_offload: bool | None = None,
                 transformer_layer_cls_to_wrap: Any = None, min_num_params: int | None = None,
                 state_dict_type: str | None = None, activation_checkpointing: bool | None = None,
                 device_mesh: tuple[int, int] | None = None, mixed_precision: Any = None, **kwargs: Any) -> None:
        own = {k: kwargs.pop(k) for k in list(kwargs) if k in FSDPOptions.__dataclass_fields__}
        super().__init__(*args, **kwargs)
        #: the constructor's FSDP options: the connector merges them over the run's (they win)
        self.option_overrides: dict[str, Any] = dict(
            sharding_strategy=sharding_strategy, offload_params=cpu_offload,
            transformer_layer_cls_to_wrap=transformer_layer_cls_to_wrap, min_num_params=min_num_params,
            state_dict_type=state_dict_type, activation_checkpointing=activation_checkpointing,
            device_mesh=device_mesh, **own)
        self.options: FSDPOptions = self.settings.options or resolve_fsdp_options(None, **self.option_overrides)
        self.mixed_precision = mixed_precision
        self.mesh: Any = None
        self.wrapped_names: list[str] = []  # names (inside the TaskModule) of the modules made FSDP units

    def apply_settings(self, settings: FSDPSettings) -> None:
        """Take the run's settings (see :class:`ParallelStrategy`) and their resolved FSDP options, if any."""
        super().apply_settings(settings)
        if settings.options is not None and settings.options != self.options:
            self.options = settings.options
            if not self.options.use_orig_params:
                log.warning("fsdp_config use_orig_params=False is ignored: FSDP2 always trains the original "
                            "parameters.")

    # -- set-up -----------------------------------------------------------------------------------------
    def mixed_precision_policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` for ``fully_shard``: the ``mixed_precision=`` argument, else the
        :class:`~taskfit.precision.FSDPPrecision` plugin's (see the class docstring); a plain plugin given with a
        strategy instance gets the policy of its autocast dtype."""
        if self.mixed_precision is not None:
            return self.mixed_precision
        policy = getattr(self.precision, "mixed_precision_policy", None)
        return policy() if policy is not None else fsdp_mixed_precision_policy(self.precision.autocast_dtype)

    def build_mesh(self) -> Any:
        """The device mesh: 1-D over all processes (``full_shard``/``shard_grad_op``), ``(world, 1)`` for
        ``no_shard`` (replicate), ``(replicate, shard)`` for the hybrid strategies (default ``(num_nodes,
        processes per node)``; HYBRID without an explicit 2-D mesh would silently not shard).

        Raises:
            ValueError: a ``device_mesh`` whose sizes do not multiply to the world size.
        """
        from torch.distributed.device_mesh import init_device_mesh

        kind = SHARDING_STRATEGIES[self.options.sharding_strategy][1]
        world, device = self.world_size, self.root_device.type
        if kind == "shard":
            return init_device_mesh(device, (world,), mesh_dim_names=("shard",))
        if kind == "replicate":
            shape = (world, 1)
        else:
            shape = self.options.device_mesh or (self.num_nodes, max(1, world // self.num_nodes))
        if shape[0] * shape[1] != world:
            raise ValueError(f"FSDP device_mesh {tuple(shape)} (replicate, shard) has {shape[0] * shape[1]} processes "
                             f"but the world size is {world}.")
        return init_device_mesh(device, tuple(shape), mesh_dim_names=("replicate", "shard"))

    def layer_classes(self, module: nn.Module) -> list[Any]:
        """The layer classes to wrap: the given ones, else (with ``auto_wrap``) the model's
        ``_no_split_modules`` (HF models), else none."""
        names = list(self.options.transformer_layer_cls_to_wrap)
        if not names and self.options.auto_wrap and not self.options.min_num_params:
            for m in module.modules():
                found = getattr(m, "_no_split_modules", None)
                if found:
                    names = list(found)
                    break
        return names

    def auto_wrap_units(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        """``(name, submodule)`` of every submodule of the TaskModule that becomes its own FSDP unit, innermost
        first. By class: each instance of :meth:`layer_classes`; by size: every module (not a
        ``ModuleList``/``ModuleDict``) holding at least ``min_num_params`` parameters not already in a unit
        (FSDP1's ``size_based_auto_wrap_policy`` rule).

        Raises:
            ValueError: a layer class name that no submodule has (naming the classes present).
        """
        named = [(n, m) for n, m in module.named_modules() if m is not module]
        classes = self.layer_classes(module)
        if classes:
            present = {type(m).__name__ for _, m in named}
            for c in classes:
                if isinstance(c, str) and c not in present:
                    raise ValueError(f"Could not find the transformer layer class {c!r} in the model (FSDP "
                                     f"transformer_layer_cls_to_wrap); classes present: {sorted(present)}.")

            def match(m: nn.Module) -> bool:
                return any(type(m).__name__ == c if isinstance(c, str) else isinstance(m, c) for c in classes)

            return [(n, m) for n, m in reversed(named) if match(m) and not isinstance(m, _NO_FORWARD)]
        if self.options.min_num_params:
            units: list[tuple[str, nn.Module]] = []
            threshold = self.options.min_num_params

            def visit(name: str, m: nn.Module) -> int:
                count = sum(p.numel() for p in m.parameters(recurse=False))
                for child_name, child in m.named_children():
                    count += visit(f"{name}.{child_name}" if name else child_name, child)
                if m is not module and count >= threshold and not isinstance(m, _NO_FORWARD):
                    units.append((name, m))
                    return 0
                return count

            visit("", module)
            return units
        if self.options.auto_wrap:
            log.warning("fsdp auto_wrap found nothing to wrap (no transformer_layer_cls_to_wrap, min_num_params or "
                        "_no_split_modules): the whole model is one FSDP unit.")
        return []

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Convert and move ``module``, broadcast rank 0's weights (``sync_module_states``), apply activation
        checkpointing, then ``fully_shard`` every auto-wrap unit and the root ``StepForward(module)``.
        Returns the root. ``fully_shard`` replaces every parameter by a new sharded one (a ``DTensor``):
        :meth:`setup_optimizers` re-points the run's optimizers.

        With ``cpu_ram_efficient_loading``, or when the other ranks built the model on the meta device
        (:func:`taskfit.core.rank_zero_init.rank_zero_init`), nothing is broadcast before sharding: every rank
        shards its model (on the meta device, no memory), allocates only its shards, and rank 0's weights are
        broadcast one tensor at a time into them (mirrors accelerate's FSDP2 ``cpu_ram_efficient_loading``).

        Raises:
            ValueError: see the class; rank 0's model has meta tensors.
        """
        from taskfit.strategies.rank_zero_weights import loads_from_rank_zero

        module = self.precision.convert_module(module)
        self._params_before = list(module.named_parameters())
        self._names_before = {id(p): n for n, p in self._params_before}
        lean = loads_from_rank_zero(module, self.root_device, self.global_rank, self.world_size, self._check,
                                    asked=self.options.cpu_ram_efficient_loading)
        if lean:
            return self._shard_then_load(module)
        module = module.to(self.root_device)
        if self.options.sync_module_states and self.world_size > 1:
            from taskfit.strategies.rank_zero_weights import broadcast_in_place

            broadcast_in_place(module, self._check)  # FSDP's sync_module_states
        root = StepForward(module)
        self._shard(root, module)
        return root

    def _shard_then_load(self, module: nn.Module) -> nn.Module:
        """Shard first (meta tensors stay meta), allocate this rank's shards, then fill them from rank 0's full
        state dict, broadcast tensor by tensor (see :mod:`taskfit.strategies.rank_zero_weights`)."""
        from taskfit.strategies.rank_zero_weights import has_meta_tensors, load_rank_zero_state, materialize

        meta = has_meta_tensors(module)
        if not meta:
            module = module.to(self.root_device)
        root = StepForward(module)
        full = root.state_dict() if self.is_global_zero else {}  # references, no copy
        self._shard(root, module)
        if meta:
            materialize(root, self.root_device)
        load_rank_zero_state(root, full, self.global_rank, self._check)
        log.info("FSDP2: rank 0's weights loaded into every rank's shards (%s).",
                 "meta-device model on this rank" if meta else "this rank held the model")
        return root

    def _shard(self, root: StepForward, module: nn.Module) -> None:
        """Apply activation checkpointing, then ``fully_shard`` every auto-wrap unit of ``module`` and ``root``
        with the strategy's mesh, resharding, mixed precision, offload and prefetch options."""
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        opts = self.options
        units = self.auto_wrap_units(module)
        if opts.activation_checkpointing:
            if not units:
                raise ValueError("FSDP activation_checkpointing needs layer units to recompute: set "
                                 "transformer_layer_cls_to_wrap (or auto_wrap with a model that has _no_split_modules) "
                                 "or min_num_params.")
            from torch.distributed._composable import checkpoint

            for _, m in units:
                checkpoint(m)
        self.mesh = self.build_mesh()
        reshard = opts.reshard_after_forward
        if reshard is None:
            reshard = SHARDING_STRATEGIES[opts.sharding_strategy][0]
        offload = CPUOffloadPolicy(pin_memory=self.accelerator.supports_pin_memory()) if opts.offload_params \
            else OffloadPolicy()
        kwargs = dict(mesh=self.mesh, reshard_after_forward=reshard, mp_policy=self.mixed_precision_policy(),
                      offload_policy=offload)
        for _, m in units:
            fully_shard(m, **kwargs)
        fully_shard(root, **kwargs)
        self.wrapped_names = [n for n, _ in units]
        ordered = [m for _, m in reversed(units)]  # forward order
        if opts.forward_prefetch:
            for m, nxt in zip(ordered, ordered[1:]):
                m.set_modules_to_forward_prefetch([nxt])
        if opts.backward_prefetch == "no_prefetch":
            for m in [root, *ordered]:
                m.set_modules_to_backward_prefetch([])
        log.info("FSDP2: %s, %d auto-wrapped unit(s), offload=%s, mesh %s.", opts.sharding_strategy, len(units),
                 opts.offload_params, tuple(self.mesh.shape))

    def setup_optimizers(self, module: nn.Module, optimizers: list[Any]) -> list[Any]:
        """Replace the parameters ``optimizers`` were built over by the sharded parameters ``fully_shard`` put in
        their place (by name; optimizer state, if any, moves with them).

        Raises:
            ValueError: an optimizer holds a parameter that is not one of ``module``'s.
        """
        from taskfit.strategies.rank_zero_weights import repoint_optimizers

        repoint_optimizers(module, optimizers, getattr(self, "_names_before", {}))
        self._params_before, self._names_before = [], {}  # drop the references to the replaced parameters
        return optimizers

    # -- step -------------------------------------------------------------------------------------------
    def no_backward_sync(self, enabled: bool = True) -> ContextManager:
        """While ``enabled``, skip the reduce-scatter (``set_requires_gradient_sync(False)``; unsharded gradients
        accumulate locally). Not with CPU offload, where every micro-batch reduces (its gradients live on the CPU
        as shards)."""
        if not enabled or self.model is None or self.options.offload_params:
            return contextlib.nullcontext()
        return self._gradient_sync_off()

    @contextlib.contextmanager
    def _gradient_sync_off(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Clip the global L2 norm of the sharded gradients: ``clip_grad_norm_`` on DTensor gradients reduces the
        per-shard norms across the mesh. Returns the norm before clipping (a plain 0-dim tensor)."""
        norm = super().clip_gradients(parameters, max_norm, optimizer)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    # -- full state dicts ---------------------------------------------------------------------------------
    def _prefix_of(self, module: nn.Module) -> str | None:
        if self.model is None:
            return None
        for name, m in self.model.named_modules():
            if m is module:
                return f"{name}." if name else ""
        return None

    def _full_model_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Gather the whole root's full state dict (a collective: every rank must call it) onto rank 0's CPU and
        keep ``module``'s part under its own key names; other ranks get ``{}``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = self._check("full state dict gather", lambda: get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        prefix = self._prefix_of(module) or ""
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    def _is_writer(self) -> bool:
        each_node = self.settings.save_on_each_node
        return self.local_rank == 0 if each_node else self.is_global_zero

    def model_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The full, unsharded state dict of ``module`` with single-device keys, gathered to rank 0's CPU (a
        collective: every rank calls this, as ``save_model`` and the checkpoint code do; others get ``{}``)."""
        if self._prefix_of(module) is None:
            return module.state_dict()
        return self._full_model_state(module)

    def adapter_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The full tensors of PEFT ``module``'s adapter parameters only, gathered one by one onto rank 0's CPU
        (a collective; other ranks get ``{}``): the frozen base is never gathered."""
        from taskfit.io.peft_files import adapter_parameter_names

        prefix = self._prefix_of(module)
        if prefix is None:
            return super().adapter_state_dict(module)
        names = adapter_parameter_names(module)
        out: dict[str, torch.Tensor] = {}
        for name, p in self.model.named_parameters():  # the same order on every rank
            key = name[len(prefix):] if name.startswith(prefix) else None
            if key in names:
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                if self.is_global_zero:
                    out[key] = full.detach().cpu().clone()
        return out

    def _model_file_name(self) -> str:
        return "model.safetensors" if self.settings.save_safetensors else "pytorch_model.bin"

    # -- checkpoints --------------------------------------------------------------------------------------
    def save_checkpoint_shards(self, module: nn.Module, optimizer: Any, folder: str) -> list[str] | None:
        """``state_dict_type="sharded"``: every rank writes its model and optimizer shards with
        ``torch.distributed.checkpoint`` into ``folder/shards/`` (no gather) and returns its file names.
        ``"full"``: model and optimizer are gathered to rank 0, which writes ``model.safetensors`` (keys of a
        single-device run) and ``optimizer.pt`` (``Optimizer.state_dict()`` form), loadable by any strategy; of a
        PEFT model only the adapter is gathered and the checkpoint code writes it in PEFT's layout (as accelerate's
        ``save_fsdp_model(adapter_only=True)`` for ``transformers.Trainer``), no full weights.

        Raises:
            ValueError: a remote ``folder`` with sharded checkpoints.
        """
        from taskfit.io.checkpoint_io import join, serialize
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
        )

        if self.model is None:
            return None
        io = self.checkpoint_io
        if self.options.state_dict_type == "full":
            from taskfit.io.peft_files import is_peft_model
            from taskfit.strategies.checkpointing import exportable_model  # the same module save_model exports

            target = exportable_model(module)
            # a PEFT model: no full weights; the checkpoint code gathers and writes only the adapter (PEFT's files)
            adapter_only = is_peft_model(target)
            weights = None if adapter_only else self._full_model_state(target)
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            osd = self._check("full optimizer state gather",
                              lambda: get_optimizer_state_dict(module, optimizer, options=full)) if optimizer else None
            if not self.is_global_zero:
                return []
            names = [] if adapter_only else [self._model_file_name()]
            if weights is not None:
                io.write_bytes(join(folder, names[0]), serialize(names[0], weights))
            if osd is not None:  # copied by serialising now: on the CPU the gathered state aliases live tensors
                names.append("optimizer.pt")
                io.write_bytes(join(folder, "optimizer.pt"), serialize("optimizer.pt", optimizer_state_by_index(osd)))
            return names
        import torch.distributed.checkpoint as dcp

        path = shard_folder(local_folder(io, folder))
        state: dict[str, Any] = {"model": get_model_state_dict(module, options=_model_options(module))}
        if optimizer is not None:
            state["optim"] = get_optimizer_state_dict(module, optimizer)
        self._check("torch.distributed.checkpoint save",
                    lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(path, single_file_per_rank=True)))
        return rank_file_names(self.global_rank, with_metadata=self.is_global_zero)

    def _load_full_model(self, module: nn.Module, folder: str, reader: Any) -> bool:
        """Load full weights (``model.safetensors``/``pytorch_model.bin``), or a PEFT model's adapter files (a
        ``"full"`` checkpoint of a PEFT model, a single-device or DDP adapter checkpoint), into sharded ``module``:
        every rank reads the full tensors and cuts its own shard locally (no collective). False: neither there."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        from taskfit.io.peft_files import adapter_state_by_model_key, has_adapter_files, is_peft_model
        from taskfit.strategies.checkpointing import exportable_model

        files, target = reader.manifest["files"], exportable_model(module)
        weights = next((n for n in ("model.safetensors", "pytorch_model.bin") if n in files), None)
        if weights is None and is_peft_model(target) and has_adapter_files(files):
            adapter = adapter_state_by_model_key(target, files, reader.read, folder)
            own = {k: v for k, v in get_model_state_dict(target).items() if k in adapter}
            set_model_state_dict(target, shard_like(adapter, own), options=StateDictOptions(strict=False))
            return True
        if weights is None:
            return False
        full_model = reader.read(weights)
        own = get_model_state_dict(target)
        missing, unexpected = sorted(set(own) - set(full_model)), sorted(set(full_model) - set(own))
        if missing or unexpected:
            raise ValueError(f"{folder!r} does not match {type(target).__name__}: missing keys {missing[:5]}, "
                             f"unexpected keys {unexpected[:5]}.")
        set_model_state_dict(target, shard_like(full_model, own))
        return True

    def load_checkpoint_shards(self, module: nn.Module, optimizer: Any, folder: str, names: list[str],
                               reader: Any = None) -> bool:
        """Restore model and optimizer: from the DCP shards (any world size: DCP reshards), or, without shards,
        from full ``model.safetensors`` (a PEFT model: its adapter files) and ``optimizer.pt`` (a ``"full"`` FSDP
        checkpoint or one written by a single-device / DDP run), each rank keeping its shard. Returns True when it
        restored them."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
            set_optimizer_state_dict,
        )

        from taskfit.io.checkpoint_format import CheckpointReader

        if self.model is None:
            return False
        reader = reader or CheckpointReader(self.checkpoint_io, folder)
        if is_dcp_checkpoint(names):
            import torch.distributed.checkpoint as dcp

            from taskfit.strategies.checkpoint_shards import dcp_reader, verified_shard_bytes

            path = shard_folder(local_folder(self.checkpoint_io, folder))
            options = _model_options(module)
            state: dict[str, Any] = {"model": get_model_state_dict(module, options=options)}
            if optimizer is not None:
                state["optim"] = get_optimizer_state_dict(module, optimizer)
            self._check("torch.distributed.checkpoint load",
                        lambda: dcp.load(state, storage_reader=dcp_reader(path, verified_shard_bytes(reader),
                                                                       reader.weights_only)))
            set_model_state_dict(module, state["model"], options=options)
            if optimizer is not None:
                set_optimizer_state_dict(module, optimizer, state["optim"])
            return True
        if not self._load_full_model(module, folder, reader):
            return False
        manifest = reader.manifest
        if optimizer is not None and "optimizer.pt" in manifest["files"]:
            osd = optimizer_state_by_name(reader.read("optimizer.pt"),
                                          parameter_names(module, optimizer))
            own_osd = get_optimizer_state_dict(module, optimizer)
            set_optimizer_state_dict(module, optimizer, {"state": shard_like(osd["state"], own_osd["state"]),
                                                         "param_groups": osd["param_groups"]})
        return True
