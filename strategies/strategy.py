"""The strategy interface: placement and communication (DESIGN.md). Owns the accelerator, precision plugin
and checkpoint IO. Mirrors Lightning's ``Strategy``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Callable, ContextManager

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from taskfit.accelerators.accelerator import Accelerator
from taskfit.io.checkpoint_io import CheckpointIO, TorchCheckpointIO
from taskfit.precision.precision import Precision
from taskfit.strategies.settings import StrategySettings
from taskfit.strategies.step_path import plain_step_parts, step_originals

_CPU = torch.device("cpu")  # compared by value: cheaper than reading .type (~0.5 µs) per micro-batch


class Strategy:
    """Base strategy for one process; distributed strategies override the communication methods.

    The contract (mirrors Lightning Fabric's ``Strategy.setup_module_and_optimizers``): :meth:`launch` runs a
    stage on every process, :meth:`setup` returns the wrapped module, optimizers and schedulers of one run (all
    wrapping happens there), the step methods (:meth:`backward`, :meth:`clip_gradients`, :meth:`optimizer_step`)
    act on what :meth:`setup` returned, :meth:`save_checkpoint`/:meth:`load_checkpoint` are the only way to and
    from checkpoint files, and :meth:`teardown` ends every stage. Callers read the capability attributes below
    instead of testing the strategy's class.

    Args:
        accelerator (Accelerator): the device kind.
        device (torch.device): the device of this process.
        precision (Precision): numerics plugin.
        checkpoint_io (CheckpointIO | None): storage plugin; ``TorchCheckpointIO`` when None.
    """

    name = "base"
    #: each process holds only a part of the parameters (FSDP, ZeRO-3, XLA-FSDP): full weights need a gather
    shards_parameters = False
    #: how many optimizers one run may have (None: any number)
    max_optimizers: int | None = None
    #: backward, gradient clipping and the optimizer step belong to an engine (DeepSpeed)
    engine_owns_step = False
    #: several processes take part (collectives are real)
    parallel = False
    #: the precision plugin class this strategy needs (the connector builds it from the precision name); None:
    #: the registry's plain plugins (mirrors the per-strategy plugins of Lightning Fabric's connector)
    precision_plugin: type[Precision] | None = None
    #: the settings this strategy reads (:mod:`taskfit.strategies.settings`); the connector resolves them
    settings_type: type[StrategySettings] = StrategySettings
    #: the constructor options of an object given only its own options (``ModelParallelStrategy(
    #: data_parallel_size=2)``, Lightning's form): the connector builds the named strategy from them; None: a
    #: complete strategy
    deferred: dict[str, Any] | None = None
    #: starts the worker processes (``taskfit.strategies.launchers``); None: nothing to start
    launcher: Any = None
    #: the ``DeviceMesh`` the strategy lays the model on (model parallel); None: no mesh
    device_mesh: Any = None

    def __init__(self, accelerator: Accelerator, device: torch.device, precision: Precision,
                 checkpoint_io: CheckpointIO | None = None) -> None:
        self.accelerator = accelerator
        self.root_device = device
        self.precision = precision
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self.model: torch.nn.Module | None = None
        self._module: torch.nn.Module | None = None  # the unwrapped module self.model wraps
        if not hasattr(self, "settings"):  # a subclass may have applied its settings before this runs
            self.settings: StrategySettings = self.settings_type()

    @property
    def builds_own_optimizer(self) -> bool:
        """True when the backend creates the run's optimizer itself (a DeepSpeed config with an ``optimizer``
        section): :meth:`setup` then gets no optimizer and returns the backend's."""
        return False

    def apply_settings(self, settings: StrategySettings) -> None:
        """Take the settings of the run about to start, resolved from its options by the connector
        (:func:`taskfit.connector.configure_strategy`; a hyperparameter-search trial or an ``auto_find_batch_size``
        retry brings new ones). Strategies that derive state from them re-derive it here.

        Args:
            settings (StrategySettings): an instance of :attr:`settings_type`.

        Raises:
            TypeError: settings of another strategy family.
        """
        if not isinstance(settings, self.settings_type):
            raise TypeError(f"strategy={self.name!r} takes {self.settings_type.__name__}; got "
                            f"{type(settings).__name__}.")
        self.settings = settings

    # -- capabilities callers ask for (defaults of one process holding the whole model) ---------------------
    @property
    def data_parallel_rank(self) -> int:
        """Index of this process among the processes that read different samples (tensor-parallel ranks of one
        group share theirs); here every process reads its own: :attr:`global_rank`. Mirrors Lightning's
        ``distributed_sampler_kwargs["rank"]``."""
        return self.global_rank

    @property
    def data_parallel_size(self) -> int:
        """How many processes read different samples; here :attr:`world_size`."""
        return self.world_size

    def prepare_for_configure_model(self, module: torch.nn.Module) -> None:
        """Before the module's ``configure_model`` hook: model-parallel strategies check the module and build the
        device mesh it reads. Nothing here."""

    def check_collective(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run the collective ``fn`` and return its result; multi-process strategies turn a communication failure
        into ``DistributedError`` naming ``what`` and the rank. Here there is no peer to fail: ``fn()``."""
        return fn()

    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on every process of the run and return this process's result. One process here;
        :class:`ParallelStrategy` starts the workers first (script re-launch) or runs ``fn`` inside spawned
        workers and returns rank 0's result (``ddp_spawn``)."""
        return fn(*args)

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

    def setup(self, module: torch.nn.Module, optimizers: Sequence[Any] = (), schedulers: Sequence[Any] = (), *,
              max_steps: int | None = None) -> tuple[torch.nn.Module, list[Any], list[Any]]:
        """Set up one run: convert, place and wrap ``module`` and bind ``optimizers`` (built over ``module``'s
        parameters) and ``schedulers`` to what the wrapping made of them. Returns ``(wrapped module, optimizers,
        schedulers)``; the run uses only these afterwards. A module already wrapped by this strategy keeps its
        wrapper (``validate`` after ``fit``).

        Args:
            module (nn.Module): the TaskModule.
            optimizers (Sequence[Optimizer]): the run's optimizers (empty for validate/test/predict).
            schedulers (Sequence[LRScheduler]): their LR schedulers (returned as they are, except where the backend
                creates its own).
            max_steps (int | None): optimizer steps of the run (backends that resolve schedules from it).

        Raises:
            ValueError: more optimizers than the backend supports (:attr:`max_optimizers`), before any work.
        """
        optimizers = list(optimizers)
        if self.max_optimizers is not None and len(optimizers) > self.max_optimizers:
            raise ValueError(f"strategy={self.name!r} supports at most {self.max_optimizers} optimizer(s) per run; "
                             f"configure_optimizers returned {len(optimizers)}. Combine the parameter groups into one "
                             "optimizer, or use strategy='ddp' (any number of optimizers).")
        if module is not self._module or self.model is None:
            self.model = self.setup_module(module)
            self._module = module
        return self.model, self.setup_optimizers(module, optimizers), list(schedulers)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert ``module`` to the plugin's dtype and move it to this process's device; returns the module the
        steps run through (a wrapper in distributed strategies). Called by :meth:`setup`, once per module."""
        module = self.precision.convert_module(module)
        return module.to(self.root_device)

    def setup_optimizers(self, module: torch.nn.Module, optimizers: list[Any]) -> list[Any]:
        """Point ``optimizers`` at the parameters :meth:`setup_module` left in ``module`` (sharding strategies
        replace parameter objects); returns them. Identity here."""
        return optimizers

    def use_eval_precision(self, module: torch.nn.Module, dtype: torch.dtype | None) -> None:
        """HF ``fp16_full_eval``/``bf16_full_eval``: switch this strategy to a true-``dtype`` plugin for evaluation
        outside training (module cast in place, inputs cast), keeping the training plugin; ``dtype=None``
        switches back and casts ``module`` to the training plugin's dtype (values stay rounded to 16 bits, as in
        HF). The strategy is the only owner of its precision plugin: nothing else replaces it.

        Args:
            module (torch.nn.Module): the module being evaluated.
            dtype (torch.dtype | None): ``torch.float16``, ``torch.bfloat16`` or None.
        """
        saved = getattr(self, "_training_precision", None)
        if dtype is None:
            if saved is not None:
                module.to(dtype=saved.param_dtype or torch.float32)
                self.precision, self._training_precision = saved, None
            return
        if self.precision.param_dtype == dtype:
            return
        from taskfit.precision.precision import HalfTruePrecision

        if saved is None:
            self._training_precision = self.precision
        self.precision = HalfTruePrecision(dtype)
        self.precision.convert_module(module)

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
        if device != _CPU and device.type != "cpu":  # CPU tensors are already in place: no tree walk
            batch = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device, non_blocking=True))
        return self.precision.convert_input(batch)

    # -- step -------------------------------------------------------------------------------------------
    def forward_context(self) -> ContextManager:
        """Context for forward passes (precision autocast; on MPS a missing operator is re-raised with the
        ``PYTORCH_ENABLE_MPS_FALLBACK=1`` hint)."""
        device = self.root_device
        kind = "cpu" if device == _CPU else device.type
        if kind == "mps":
            stack = contextlib.ExitStack()
            stack.enter_context(self.accelerator.missing_op_hint())
            stack.enter_context(self.precision.forward_context("mps"))
            return stack
        return self.precision.forward_context(kind)

    def no_backward_sync(self, enabled: bool = True) -> ContextManager:
        """Inside (with ``enabled``), backward passes of the module :meth:`setup` wrapped accumulate gradients
        locally without synchronising them (DDP ``no_sync``, FSDP ``set_requires_gradient_sync(False)``,
        DeepSpeed: not an accumulation boundary): use ``enabled=not last`` on every micro-batch of an
        accumulation window. A no-op on one process. Mirrors Lightning Fabric's ``no_backward_sync(module,
        enabled)``.

        Args:
            enabled (bool): skip the synchronisation (False: this backward synchronises, as without the block).
        """
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate a scalar ``loss`` through the precision plugin (``args``/``kwargs``, e.g. ``retain_graph``,
        go to ``Tensor.backward``)."""
        self.precision.backward(loss, *args, **kwargs)

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float,
                       optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Clip the global L2 norm of ``parameters``' gradients to ``max_norm``; the gradients are unscaled
        already (:meth:`before_optimizer_step` or :meth:`unscale_gradients`: this never unscales, so a norm read
        after the step is not divided twice).

        Returns the total norm before clipping as a 0-dim tensor (no host sync). Mirrors
        ``torch.nn.utils.clip_grad_norm_``; sharded strategies compute the norm across shards.
        """
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def clip_gradients_value(self, parameters: list[torch.Tensor], clip_value: float,
                             optimizer: torch.optim.Optimizer) -> None:
        """Clamp every (already unscaled) gradient of ``parameters`` to ``[-clip_value, clip_value]`` in place
        (``gradient_clip_algorithm="value"``; mirrors ``torch.nn.utils.clip_grad_value_``, which it calls here;
        tensor-parallel strategies clamp DTensor shards)."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the loss scale (``"16-mixed"``; a no-op otherwise). Once per
        optimizer per step: the precision plugin tracks what it unscaled, a second call does nothing."""
        self.precision.unscale_gradients(optimizer)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer,
                              hook: Callable[[torch.optim.Optimizer], Any] | None = None) -> None:
        """The first half of an optimizer step, the one place the step path unscales: :meth:`unscale_gradients`,
        then ``hook(optimizer)`` (the loop's ``on_before_optimizer_step`` and clipping), which so sees unscaled
        gradients (Lightning's order: ``_after_closure`` unscales before ``on_before_optimizer_step``)."""
        self.unscale_gradients(optimizer)
        if hook is not None:
            hook(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None,
                       **kwargs: Any) -> bool:
        """Step ``optimizer`` through the precision plugin (which unscales first when :meth:`before_optimizer_step`
        did not: manual optimization, ``Engine``); False when the step was skipped (non-finite gradients).
        ``closure`` and ``kwargs`` reach ``optimizer.step(closure=..., **kwargs)`` (Lightning's
        ``Strategy.optimizer_step``)."""
        return self.precision.optimizer_step(optimizer, closure, **kwargs)

    def plain_step_parts(self) -> frozenset[str]:
        """The step-path methods that are plain here (``taskfit.strategies.step_path.PLAIN_STEP_PARTS``: e.g.
        ``"backward"`` when :meth:`backward` is ``loss.backward()``), so the fit loop may skip their layer per
        micro-batch; call it once the strategy is set up (device and precision final). A subclass or an instance
        that overrides one of those methods, or a wrapper set on this class later, drops that part.

        Returns:
            frozenset[str]: part names, a subset of ``PLAIN_STEP_PARTS``.
        """
        return plain_step_parts(self, _STEP_ORIGINALS)

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

    def adapter_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) tensors of PEFT ``module``'s adapter parameters
        (:func:`~taskfit.io.peft_files.adapter_parameter_names`), what an adapter checkpoint writes; sharded
        strategies gather only these, never the frozen base (a collective there: every rank calls it)."""
        from taskfit.io.peft_files import adapter_parameter_names

        names = adapter_parameter_names(module)
        return {k: v for k, v in self.model_state_dict(module).items() if k in names}

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

    def save_checkpoint(self, folder: str, files: dict[str, Any], module: torch.nn.Module | None = None,
                        optimizers: Sequence[Any] = (), *, plan: Any = None) -> str:
        """Write checkpoint ``folder`` in the checkpoint format (:mod:`taskfit.strategies.checkpointing`): the
        writing rank clears it, every rank writes ``files`` (its ``{name: object}``, chosen by the caller) plus
        ``module``'s and ``optimizers``' states (this strategy's shards through :meth:`save_checkpoint_shards`, else
        the full weights and ``optimizer.pt``...), the writing rank the manifest last. The only way to checkpoint
        files. Every process must call it. Returns ``folder``.

        Args:
            folder (str): the checkpoint folder (path or fsspec URL).
            files (dict): this rank's files besides the model and optimizer states.
            module (nn.Module | None): the model (unwrapped); None: no weights.
            optimizers (Sequence[Optimizer]): their states go into the folder (not with ``save_only_model``).
            plan (FolderPlan | None): manifest header, writing rank, rotation; None:
                :meth:`~taskfit.strategies.checkpointing.FolderPlan.default`.

        Raises:
            ValueError: several optimizers under a strategy that shards the optimizer state; a remote folder for
                a backend that writes local files.
        """
        from taskfit.strategies.checkpointing import FolderPlan, save_folder

        plan = plan or FolderPlan.default(self, folder)
        return save_folder(self, folder, files, module, optimizers, plan)

    def load_checkpoint(self, folder: str, module: torch.nn.Module, optimizers: Sequence[Any] = (),
                        reader: Any = None) -> Any:
        """Restore ``module`` (this strategy's shards through :meth:`load_checkpoint_shards`, else the full weights)
        and ``optimizers`` from checkpoint ``folder``, every file verified against the manifest on the bytes loaded.
        ``reader`` (a :class:`~taskfit.io.checkpoint_format.CheckpointReader` of ``folder``, e.g. the one a resume
        plan read the loop state with) is opened here when None (``weights_only=True``). Returns
        :class:`~taskfit.strategies.checkpointing.LoadedStates` (the reader, to read the other files from).

        Raises:
            CheckpointError: a missing, corrupted or unlisted file; weights that do not match ``module``.
            UnsafeCheckpointError: a file needs full unpickling and the reader is ``weights_only``.
        """
        from taskfit.strategies.checkpointing import load_states

        return load_states(self, folder, module, optimizers, reader)

    def teardown(self) -> None:
        """End of a stage (``fit``, ``validate``, ``test``, ``predict``; always runs, also after an error): wait for
        and release background checkpoint IO (re-raising a failed background save) and the accelerator's cached
        memory. The process group stays for the next stage; it is destroyed at exit."""
        try:
            self.checkpoint_io.teardown()
        finally:
            self.accelerator.teardown()


# the base class's own step functions, taken now: a wrapper set on the class later is called, never skipped
_STEP_ORIGINALS = step_originals(Strategy)
