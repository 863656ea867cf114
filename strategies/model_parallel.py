"""Data x tensor parallelism on a ``DeviceMesh`` (``strategy="model_parallel"``; mirrors Lightning's
``ModelParallelStrategy``). The strategy builds a 2-D mesh ``("data_parallel", "tensor_parallel")``; the
TaskModule's ``configure_model()`` parallelises itself on it (``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` / ``SequenceParallel`` plans on ``self.device_mesh["tensor_parallel"]``, ``fully_shard`` on
``self.device_mesh["data_parallel"]``), or, when it does not override ``configure_model``, the strategy applies the
model's own tensor-parallel plan (``tp_plan`` / ``_tp_plan``, as HF models declare). With more than one data-parallel
group the TaskModule is wrapped as ``StepForward(module)`` and ``fully_shard`` over the data-parallel mesh (the
FSDP strategy's root unit: gradients are averaged over the data-parallel ranks, parameters the user left
unsharded are sharded too).

Checkpoints, full-weight export and resharding are the FSDP strategy's (this class extends it): every rank writes
its DTensor shards with ``torch.distributed.checkpoint``, which a run on any world size and under any strategy reads
back (``taskfit convert`` turns them into full weights).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from taskfit.strategies.fsdp import FSDPStrategy
from taskfit.strategies.parallel import ParallelStrategy
from taskfit.strategies.wrapper import StepForward

log = logging.getLogger("taskfit")

#: the precision names this strategy runs (Lightning's ``ModelParallelStrategy`` accepts the same four)
SUPPORTED_PRECISION = ("32-true", "bf16-mixed", "bf16-true", "16-true")
MESH_DIM_NAMES = ("data_parallel", "tensor_parallel")


def model_tp_plan(module: nn.Module) -> tuple[str, dict[str, Any]] | None:
    """``(prefix, plan)`` of the first submodule of ``module`` that declares a tensor-parallel plan (``tp_plan`` or
    ``_tp_plan``: ``{module name pattern: style}``, HF models' form), prefix being its name inside ``module``
    (``""`` for ``module`` itself); None when none does."""
    for name, m in module.named_modules():
        for attr in ("tp_plan", "_tp_plan"):
            plan = getattr(m, attr, None)
            if isinstance(plan, dict) and plan:
                return name, plan
    return None


#: HF ``tp_plan`` style names -> (ParallelStyle class name, keyword arguments with layouts)
_STYLE_NAMES = {
    "colwise": ("ColwiseParallel", {}),
    "rowwise": ("RowwiseParallel", {}),
    "sequence_parallel": ("SequenceParallel", {}),
    "colwise_rep": ("ColwiseParallel", {"output_layouts": "replicate"}),
    "colwise_gather_output": ("ColwiseParallel", {"output_layouts": "replicate"}),
    "rowwise_rep": ("RowwiseParallel", {"input_layouts": "replicate"}),
    "embedding_rowwise": ("RowwiseParallel", {"input_layouts": "replicate"}),
}


def check_plan(plan: dict[str, Any]) -> None:
    """Refuse a ``tp_plan`` entry taskfit cannot apply.

    Raises:
        ValueError: a style that is neither a ``ParallelStyle`` object nor one of the HF names taskfit applies.
    """
    from torch.distributed.tensor.parallel import ParallelStyle

    for name, style in plan.items():
        if not isinstance(style, ParallelStyle) and style not in _STYLE_NAMES:
            raise ValueError(f"The model's tp_plan entry {name!r}: {style!r} is not a style taskfit applies; use "
                             f"one of {sorted(_STYLE_NAMES)} or torch ParallelStyle objects, or override "
                             "configure_model() and parallelise the model there.")


def parallel_style(style: Any) -> Any:
    """A ``ParallelStyle`` for one plan entry: a style object as it is, or an HF name (see ``_STYLE_NAMES``;
    ``*_rep`` / ``*_gather_output`` / ``embedding_rowwise`` use replicated outputs / inputs).

    Raises:
        ValueError: see :func:`check_plan`.
    """
    import torch.distributed.tensor.parallel as tp
    from torch.distributed.tensor import Replicate

    check_plan({"": style})
    if isinstance(style, tp.ParallelStyle):
        return style
    cls, kwargs = _STYLE_NAMES[style]
    return getattr(tp, cls)(**{k: Replicate() for k in kwargs})


class ModelParallelStrategy(FSDPStrategy):
    """Data-parallel x tensor-parallel training on a 2-D ``DeviceMesh`` (``("data_parallel",
    "tensor_parallel")``); mirrors ``lightning.pytorch.strategies.ModelParallelStrategy``.

    Give it by name (``Fit(strategy="model_parallel", devices=N)``: one data-parallel group per machine, tensor
    parallel over a machine's processes, Lightning's ``"auto"`` sizes) or as an object
    (``Fit(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), devices=4)``; the
    accelerator, devices and precision then come from ``Fit``'s arguments). The mesh exists before the
    TaskModule's ``configure_model()`` runs and is ``module.device_mesh`` / ``fit.device_mesh`` there.

    Args:
        data_parallel_size (int | "auto"): processes in the data-parallel dimension (``"auto"``: the number of
            machines).
        tensor_parallel_size (int | "auto"): processes in the tensor-parallel dimension (``"auto"``: processes per
            machine).
        context_parallel_size (int | None): reserved for context parallelism; only None or 1 (no context
            parallelism) is accepted: PyTorch's ``context_parallel`` shards only CUDA attention kernels.
        save_distributed_checkpoint (bool): each rank writes its shards with ``torch.distributed.checkpoint``
            (default), or False: rank 0 writes full ``model.safetensors`` / ``optimizer.pt`` (Lightning's option).
        parallelize_fn (Callable[[nn.Module, DeviceMesh], nn.Module] | None): Lightning Fabric's form: called at
            set-up with the module and the mesh, parallelises the module in place and returns it (used when the
            module does not override ``configure_model``). An ``Engine`` loop may instead parallelise the module
            itself on ``engine.device_mesh`` (built by ``engine.launch()``) before ``engine.setup()``; a module
            that already holds DTensor parameters is taken as it is.
        *args, **kwargs: the accelerator, devices, precision, ... (:class:`ParallelStrategy`), filled by ``Fit``
            for the object form.

    Raises:
        ValueError: a size that is not a positive int or ``"auto"``; ``context_parallel_size`` > 1; a precision
            outside ``32-true``, ``bf16-mixed``, ``bf16-true``, ``16-true``; at set-up: sizes whose product is not
            the world size, a module that neither overrides ``configure_model``, nor was parallelised (DTensor
            parameters, ``parallelize_fn``), nor has a model with a ``tp_plan``.
        TypeError: ``parallelize_fn`` is not callable, or does not return the module it was given.
    """

    name = "model_parallel"
    precision_plugin = None  # the plain plugins: autocast for bf16-mixed, a cast module for the true names

    def __init__(self, *args: Any, data_parallel_size: int | str = "auto", tensor_parallel_size: int | str = "auto",
                 context_parallel_size: int | None = None, save_distributed_checkpoint: bool = True,
                 parallelize_fn: Callable[[nn.Module, Any], nn.Module] | None = None, **kwargs: Any) -> None:
        if parallelize_fn is not None and not callable(parallelize_fn):
            raise TypeError(f"ModelParallelStrategy parallelize_fn must be a function (module, device_mesh) -> "
                            f"module; got {type(parallelize_fn).__name__}.")
        for what, size in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size", tensor_parallel_size)):
            if size != "auto" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise ValueError(f"ModelParallelStrategy {what}={size!r} is not valid; give a positive int or 'auto'.")
        if context_parallel_size not in (None, 1):
            # PyTorch's context_parallel() (ring attention over the sequence dimension) dispatches only CUDA's
            # flash / memory-efficient / cuDNN attention kernels; on the CPU, SDPA runs
            # aten._scaled_dot_product_flash_attention_for_cpu, which it cannot shard (it raises inside the first
            # attention call), so it cannot be proven equal to one process here and is not offered.
            raise ValueError(f"ModelParallelStrategy context_parallel_size={context_parallel_size!r} is not supported: "
                             "PyTorch's context parallelism (torch.distributed.tensor.experimental.context_parallel) "
                             "runs only CUDA's flash / memory-efficient / cuDNN attention kernels, not the CPU's, and "
                             "taskfit does not offer it untested; use None (or 1): data x tensor parallelism only.")
        sizes = dict(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size,
                     context_parallel_size=context_parallel_size,
                     save_distributed_checkpoint=save_distributed_checkpoint, parallelize_fn=parallelize_fn)
        if not args and "accelerator" not in kwargs:  # the object form: Fit builds the strategy with these sizes
            self.deferred, self.accelerator, self.model = sizes, None, None
            return
        self.deferred = None
        kwargs.setdefault("state_dict_type", "sharded" if save_distributed_checkpoint else "full")
        super().__init__(*args, **kwargs)
        self.sizes = sizes
        self.parallelize_fn = parallelize_fn
        name = getattr(self.precision, "name", "32-true")
        if name not in SUPPORTED_PRECISION:
            raise ValueError(f"strategy='model_parallel' does not support precision={name!r}; choose one of "
                             f"{list(SUPPORTED_PRECISION)}.")
        self._device_mesh: Any = None
        self.mesh_shape()  # sizes that do not fit the world size fail here, before any process starts

    # -- mesh ---------------------------------------------------------------------------------------------
    def mesh_shape(self) -> tuple[int, int]:
        """``(data_parallel_size, tensor_parallel_size)`` with ``"auto"`` resolved (Lightning: the number of
        machines x processes per machine).

        Raises:
            ValueError: sizes whose product is not the world size (naming both).
        """
        world = self.world_size
        dp, tp = self.sizes["data_parallel_size"], self.sizes["tensor_parallel_size"]
        if dp == "auto" and tp == "auto":
            dp, tp = self.num_nodes, max(1, world // self.num_nodes)
        elif dp == "auto":
            dp = world // tp if world % tp == 0 else 0
        elif tp == "auto":
            tp = world // dp if world % dp == 0 else 0
        if dp * tp != world:
            raise ValueError(f"ModelParallelStrategy data_parallel_size={self.sizes['data_parallel_size']!r} x "
                             f"tensor_parallel_size={self.sizes['tensor_parallel_size']!r} does not multiply to the "
                             f"world size {world} (num_nodes={self.num_nodes} x devices={self.num_processes}).")
        return dp, tp

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` with dimensions ``("data_parallel", "tensor_parallel")``; None before
        :meth:`setup_environment`."""
        return self._device_mesh

    def setup_environment(self) -> None:
        """Join the process group (:class:`ParallelStrategy`) and build the mesh (once).

        Raises:
            ValueError: see :meth:`mesh_shape`.
        """
        shape = self.mesh_shape()  # the sizes are checked before the process group forms
        ParallelStrategy.setup_environment(self)
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=MESH_DIM_NAMES)
            log.info("Model parallel: device mesh %s (data_parallel x tensor_parallel).", shape)
        self.mesh = self._device_mesh

    def check_module(self, module: nn.Module) -> None:
        """Refuse a TaskModule this strategy cannot parallelise.

        Raises:
            ValueError: ``module`` neither overrides ``configure_model`` nor holds a model with a ``tp_plan``; a
                ``tp_plan`` style taskfit cannot apply (:func:`check_plan`).
        """
        if self.parallelizer(module) != "tp_plan":
            return
        found = model_tp_plan(module)
        if found is None:
            raise ValueError(f"strategy='model_parallel' needs {type(module).__name__} to override "
                             "configure_model() and parallelise itself on self.device_mesh (parallelize_module / "
                             "fully_shard), or a model that declares a tp_plan; it has neither. With your own loop "
                             "(Engine), parallelise the module on engine.device_mesh before engine.setup(), or give "
                             "ModelParallelStrategy(parallelize_fn=...).")
        check_plan(found[1])

    def parallelizer(self, module: nn.Module) -> str:
        """Who parallelises ``module``: ``"configure_model"`` (a TaskModule that overrides it), ``"parallelize_fn"``
        (given to this strategy: Lightning Fabric's form), ``"done"`` (it already holds DTensor parameters: the
        user parallelised it on the mesh before set-up, e.g. in an ``Engine`` loop), else ``"tp_plan"`` (the
        model's own plan, when it declares one)."""
        from torch.distributed.tensor import DTensor

        from taskfit.core.hooks import LightningHooks, overrides

        if isinstance(module, LightningHooks) and overrides(module, "configure_model"):
            return "configure_model"
        if self.parallelize_fn is not None:
            return "parallelize_fn"
        if any(isinstance(p, DTensor) for p in module.parameters()):
            return "done"
        return "tp_plan"

    def prepare_for_configure_model(self, module: nn.Module) -> None:
        """Called at the start of a stage, before the TaskModule's ``configure_model()``: check ``module``
        (:meth:`check_module`), then form the process group and the mesh ``configure_model`` parallelises on
        (Lightning sets the mesh up in ``setup_environment``, before ``configure_model``)."""
        self.check_module(module)
        self.setup_environment()

    @property
    def data_parallel_size(self) -> int:
        """Processes that read different data (the mesh's first dimension)."""
        return self.mesh_shape()[0]

    @property
    def data_parallel_rank(self) -> int:
        """This process's index in the data-parallel dimension (the ranks of one tensor-parallel group share it)."""
        if self._device_mesh is not None:
            return self._device_mesh["data_parallel"].get_local_rank()
        return self.global_rank // self.mesh_shape()[1]

    def process_dataloader(self, dataloader: Any) -> Any:
        """Split every map-style loader over the data-parallel dimension only: the processes of one
        tensor-parallel group read the same samples (Lightning's ``distributed_sampler_kwargs``)."""
        from taskfit.data.loaders import distributed_loader

        return distributed_loader(dataloader, self.data_parallel_size, self.data_parallel_rank)

    # -- set-up ---------------------------------------------------------------------------------------------
    def setup_module(self, module: nn.Module) -> nn.Module:
        """Apply the model's ``tp_plan`` when ``configure_model`` is not overridden, convert and move the module,
        then, with more than one data-parallel group, ``fully_shard`` the root ``StepForward(module)`` over the
        data-parallel mesh. Returns the module the steps run through.

        Raises:
            ValueError: neither ``configure_model`` nor a ``tp_plan`` (nothing would be parallelised), or a plan
                style taskfit cannot apply.
        """
        self.check_module(module)
        if self._device_mesh is None:
            self.setup_environment()
        self._params_before = list(module.named_parameters())
        self._names_before = {id(p): n for n, p in self._params_before}
        module = self.precision.convert_module(module).to(self.root_device)
        how = self.parallelizer(module)
        if how == "parallelize_fn":
            returned = self.parallelize_fn(module, self._device_mesh)
            if returned is not module:  # the optimizers and the run keep the module object they were given
                raise TypeError(f"parallelize_fn must parallelise the module in place and return it (as "
                                f"parallelize_module / fully_shard do); it returned {type(returned).__name__}.")
        elif how == "tp_plan":
            self.apply_tp_plan(module, *model_tp_plan(module))
        dp, _ = self.mesh_shape()
        if dp == 1:
            self.wrapped_names = []
            return module
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        root = StepForward(module)
        fully_shard(root, mesh=self._device_mesh["data_parallel"], mp_policy=MixedPrecisionPolicy())
        self.wrapped_names = [n for n, m in module.named_modules() if hasattr(m, "set_requires_gradient_sync")]
        return root

    def apply_tp_plan(self, module: nn.Module, prefix: str, plan: dict[str, Any]) -> None:
        """``parallelize_module`` the submodule ``prefix`` of ``module`` on the tensor-parallel mesh with ``plan``
        (after broadcasting rank 0's weights, so every process starts from the same ones)."""
        from torch.distributed.tensor.parallel import parallelize_module

        if self.world_size > 1:
            self._sync_module_states(module)
        target = module.get_submodule(prefix) if prefix else module
        parallelize_module(target, self._device_mesh["tensor_parallel"],
                           {k: parallel_style(v) for k, v in plan.items()})
        log.info("Model parallel: applied the model's tp_plan (%d entries) to %s.", len(plan),
                 type(target).__name__)

    # -- step -------------------------------------------------------------------------------------------
    def no_backward_sync(self, enabled: bool = True) -> ContextManager:
        """While ``enabled``, skip the data-parallel gradient reduction (when a root FSDP unit exists)."""
        if not enabled or not hasattr(self.model, "set_requires_gradient_sync"):
            return contextlib.nullcontext()
        return self._gradient_sync_off()

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Clip the global L2 norm over every gradient shard: DTensor gradients (tensor- and/or data-parallel
        shards, replicas counted once) and plain ones (replicated on every process) together. Returns the norm
        before clipping (a plain 0-dim tensor)."""
        from taskfit.strategies.tp_clip import clip_grad_norm

        return clip_grad_norm(parameters, max_norm)

    def clip_gradients_value(self, parameters: list[torch.Tensor], clip_value: float,
                             optimizer: torch.optim.Optimizer) -> None:
        """Clamp every gradient to ``[-clip_value, clip_value]``: plain gradients and DTensor shards alike (value
        clipping is elementwise, so each process clamps its own shard; a pending ``Partial`` sum is reduced
        first), equal to clamping the full gradients on one process (:func:`~taskfit.strategies.tp_clip.
        clip_grad_value`)."""
        from taskfit.strategies.tp_clip import clip_grad_value

        clip_grad_value(parameters, clip_value)
