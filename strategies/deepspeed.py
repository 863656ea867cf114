"""DeepSpeed ZeRO (``strategy="deepspeed"``, ``"deepspeed_stage_1|2|3"``, ``"..._offload"``, HF ``deepspeed=``;
F-STRAT-6, F-CKPT-5, F-PREC-3). Mirrors Lightning's ``DeepSpeedStrategy`` and the HF Trainer's DeepSpeed
integration.

The engine owns backward (``engine.backward``), gradient reduction, accumulation boundaries, clipping
(``gradient_clipping`` <- ``max_grad_norm``) and the optimizer step (``engine.step``); the fit loop still decides
where a window ends (:meth:`DeepSpeedStrategy.no_backward_sync` sets the engine's boundary for every micro-batch, so the
shorter last window of an epoch is one optimizer step as everywhere else) and steps the LR schedule after each
applied step (a DeepSpeed schedule from the config becomes the run's scheduler; the engine does not step it too).

The engine is built in :meth:`DeepSpeedStrategy.setup` from the run's optimizer (handed to
``deepspeed.initialize``) or, when the config has an ``optimizer`` section (always with optimizer offload), from
DeepSpeed's own optimizer, which ``setup`` returns in place of the run's (with its schedule).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, ContextManager

import torch
from lightning_utilities.core.imports import RequirementCache

from taskfit.precision.deepspeed import DeepSpeedPrecision
from taskfit.strategies.deepspeed_config import finalize_config
from taskfit.strategies.parallel import ParallelStrategy
from taskfit.strategies.settings import DeepSpeedRequest, DeepSpeedSettings
from taskfit.strategies.wrapper import StepForward

log = logging.getLogger("taskfit")
_DEEPSPEED = RequirementCache("deepspeed>=0.14")
#: engine checkpoint tag and the metadata file taskfit writes next to the engine files (under ``shards/``)
TAG = "deepspeed"
META_NAME = "shards/taskfit_deepspeed.json"


def require_deepspeed() -> Any:
    """Import and return ``deepspeed``.

    Raises:
        ModuleNotFoundError: DeepSpeed is not installed (names the extra: ``pip install taskfit[deepspeed]``).
    """
    if not _DEEPSPEED:
        raise ModuleNotFoundError(f"DeepSpeed is needed for the DeepSpeed strategies: pip install 'taskfit[deepspeed]' "
                                  f"({_DEEPSPEED.message}).")
    import deepspeed

    return deepspeed


def _keep_engine_grads(optimizer: Any) -> None:
    """Make ``optimizer.zero_grad`` a no-op: the engine's optimizer wrapper clears gradients itself in
    ``engine.step`` (called only when such a wrapper holds ``optimizer``).

    Under ZeRO the optimizer's parameters are the engine's fp32 partitions, and with optimizer offload
    (``cpu_offload``) their ``.grad`` tensors are buffers allocated once and filled in place at every accumulation
    boundary. The fit loop's ``optimizer.zero_grad(set_to_none=True)`` after each step would set them to None and
    the next boundary would fail inside DeepSpeed (``'NoneType' object has no attribute 'view'`` in
    ``copy_grads_in_partition``).
    """
    def zero_grad(set_to_none: bool = True) -> None:
        return None

    optimizer.zero_grad = zero_grad


class DeepSpeedStrategy(ParallelStrategy):
    """DeepSpeed ZeRO data parallelism over ``devices`` x ``num_nodes`` processes (gloo and DeepSpeed's CPU
    accelerator on CPU machines).

    Args:
        *args: as :class:`ParallelStrategy` (accelerator, devices, precision, checkpoint_io, num_nodes,
            settings).
        config (dict | str | None): a DeepSpeed config (dict, JSON string or JSON file path); default the
            ``deepspeed`` option (HF ``deepspeed=``). The connector fills its ``"auto"`` values from the run's
            options (:func:`taskfit.strategies.deepspeed_config.resolve_config` lists the mapping) and hands the
            result over as :class:`~taskfit.strategies.settings.DeepSpeedSettings`.
        stage (int | None): ZeRO stage 0-3 of the preset (registry names ``deepspeed_stage_N``); None: the
            config's stage, else 2.
        offload_optimizer (str | None): ``"cpu"`` or ``"nvme"``: offload optimizer states (DeepSpeedCPUAdam,
            JIT-compiled with gcc on first use: tens of seconds, cached after).
        offload_parameters (str | None): ``"cpu"`` or ``"nvme"``: offload parameters (stage 3 only).
        nvme_path (str | None): folder for NVMe offload (default ``/local_nvme``; needs DeepSpeed's async-IO op).

    Environment: ``TASKFIT_DEEPSPEED_SHM_COMM=0`` skips DeepSpeed's shared-memory all-reduce op on CPU (a gcc JIT
    build of about a minute on first use; collectives then go through gloo).

    Raises:
        ModuleNotFoundError: DeepSpeed is not installed.
        ValueError: config/argument conflicts (all in one message), fp16 on CPU, an unsupported precision, or a
            bad stage/offload value, before any work starts.
    """

    name = "deepspeed"
    max_optimizers = 1
    engine_owns_step = True
    settings_type = DeepSpeedSettings
    settings: DeepSpeedSettings

    @property
    def shards_parameters(self) -> bool:  # type: ignore[override]
        """ZeRO-3 partitions the parameters (stages 0-2 keep full copies on every rank)."""
        return self.zero_stage == 3
    precision_plugin = DeepSpeedPrecision

    def __init__(self, *args: Any, config: Any = None, stage: int | None = None, offload_optimizer: str | None = None,
                 offload_parameters: str | None = None, nvme_path: str | None = None, **kwargs: Any) -> None:
        require_deepspeed()
        super().__init__(*args, **kwargs)
        if not isinstance(self.precision, DeepSpeedPrecision):  # the engine owns the numerics
            raise TypeError(f"DeepSpeedStrategy needs a DeepSpeedPrecision plugin (the engine casts and scales), got "
                            f"{type(self.precision).__name__}; pass precision= by name or DeepSpeedPrecision(...).")
        #: what the config is resolved from besides the run's options (the connector reads it)
        self.config_request = DeepSpeedRequest(config, stage, offload_optimizer, offload_parameters,
                                               nvme_path or "/local_nvme", on_cpu=self.root_device.type == "cpu")
        self.config: dict[str, Any] = self.settings.config
        self.engine: Any = None
        self._grad_norm = torch.zeros(())

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage (0-3) of the resolved config (before the connector resolved it: the preset's, else 2)."""
        zero = self.config.get("zero_optimization") or {"stage": self.config_request.stage or 2}
        return int(zero["stage"])

    # -- set-up -----------------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Join the process group (``ParallelStrategy``), then let DeepSpeed's communication layer use it."""
        super().setup_environment()
        for key, value in (("RANK", self.global_rank), ("LOCAL_RANK", self.local_rank), ("WORLD_SIZE", self.world_size)):
            os.environ.setdefault(key, str(value))  # DeepSpeed reads them (one process runs without a launcher)
        deepspeed = require_deepspeed()
        if os.environ.get("TASKFIT_DEEPSPEED_SHM_COMM", "1") == "0":  # skip the JIT build of the CPU shared-memory
            import deepspeed.ops                                        # all-reduce op: plain gloo collectives
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=self.backend, auto_mpi_discovery=False,
                                   rank=self.global_rank, world_size=self.world_size)

    def setup(self, module: torch.nn.Module, optimizers: Any = (), schedulers: Any = (), *,
              max_steps: int | None = None) -> tuple[torch.nn.Module, list[Any], list[Any]]:
        """Build the engine: ``deepspeed.initialize`` over ``module`` with the run's optimizer (or, when the config
        has an ``optimizer`` section, DeepSpeed's own optimizer and schedule, returned in place of the run's).
        A model the other ranks built on the meta device (:func:`taskfit.core.rank_zero_init.rank_zero_init`,
        ``cpu_ram_efficient_loading``) is filled from rank 0's weights first (:meth:`_fill_from_rank_zero`).
        Without an optimizer (``validate``/``test``/``predict``) the module is only placed, or, when it is the
        module of the engine of an earlier ``fit``, that engine is kept (ZeRO-3 gathers its parameters).
        A new optimizer for the same module (``fit`` called again) replaces the engine (the old one is
        destroyed: its gradient hooks go).

        Returns:
            tuple: ``(engine or module, [optimizer], [scheduler])``.

        Raises:
            ValueError: more than one optimizer (DeepSpeed drives exactly one), before any work; under ZeRO-3 a
                second training setup of a module an earlier engine partitioned; rank 0's model has meta tensors.
        """
        from taskfit.strategies.rank_zero_weights import loads_from_rank_zero

        optimizers, schedulers = list(optimizers), list(schedulers)
        meta = loads_from_rank_zero(module, self.root_device, self.global_rank, self.world_size, self._check)
        if len(optimizers) > 1:
            raise ValueError(f"strategy={self.name!r} drives exactly one optimizer per engine; configure_optimizers "
                             f"returned {len(optimizers)}. Combine the parameter groups into one optimizer, or use "
                             "strategy='ddp'.")
        if (not optimizers and not self.builds_own_optimizer) or max_steps is None:
            if self.engine is not None and module is self._module:
                return self.engine, optimizers, schedulers
            if meta:
                self._fill_from_rank_zero(module, optimizers, None)
            self._module = module.to(self.root_device)
            self.model = self._module
            return self._module, optimizers, schedulers
        if self.engine is not None and module is self._module and self.zero_stage == 3:
            raise ValueError("DeepSpeed ZeRO-3 partitioned this module's parameters for an earlier fit(); another "
                             "fit() needs a fresh model: pass one, or give Fit(model_init=...) and call fit() "
                             "without a model.")
        self._destroy_engine()
        if meta:
            optimizers = self._fill_from_rank_zero(module, optimizers, max_steps if self.zero_stage == 3 else None)
        self._module = module.to(self.root_device)
        return self._build_engine(self._module, optimizers[0] if optimizers else None,
                                  schedulers[0] if schedulers else None, max_steps)

    def _fill_from_rank_zero(self, module: torch.nn.Module, optimizers: list[Any],
                             partition_for: int | None) -> list[Any]:
        """Give the meta tensors of ``module`` storage on this rank's device (tied weights stay tied) and fill them
        from rank 0's weights before ``deepspeed.initialize`` sees the module, then re-point ``optimizers`` built
        over the meta parameters at the new ones (by name). A collective.

        ZeRO-0/1/2 (``partition_for`` None; also any stage without an engine to build): uninitialised storage for
        the whole model, into which rank 0's tensors are broadcast one at a time and in place
        (:func:`~taskfit.strategies.rank_zero_weights.broadcast_in_place`, DDP's and FSDP's ``sync_module_states``
        broadcast); every rank then holds the full parameters once, as these stages keep them. ZeRO-3
        (``partition_for``: the run's ``max_steps``, for the engine's config): :meth:`_partition_from_rank_zero`,
        DeepSpeed's own broadcast-and-partition, so no rank but the first holds a whole copy.

        Raises:
            ValueError: an optimizer holds a parameter that is not one of ``module``'s.
        """
        from taskfit.strategies.rank_zero_weights import broadcast_in_place, materialize, repoint_optimizers

        names = {id(p): n for n, p in module.named_parameters()}
        if partition_for is not None:
            self._partition_from_rank_zero(module, partition_for)
        else:
            materialize(module, self.root_device)  # a no-op on rank 0, whose weights every rank receives
            broadcast_in_place(module.to(self.root_device), self._check)
        log.info("DeepSpeed: rank 0's weights loaded into every rank's model before deepspeed.initialize.")
        return repoint_optimizers(module, optimizers, names)

    def _partition_from_rank_zero(self, module: torch.nn.Module, max_steps: int) -> None:
        """ZeRO-3: submodule by submodule (children first, in the order of ``module.parameters()``), give this
        rank's meta parameters storage and convert them with DeepSpeed's ``zero.Init(module=...)`` and the engine's
        config (its dtype and parameter offload), which broadcasts each parameter from rank 0 and keeps this rank's
        partition: what the engine does to an unpartitioned module, and ``zero.Init`` to a model built inside it (as
        transformers' ``from_pretrained`` does under ZeRO-3). A meta rank so holds its partitions and one
        submodule's full parameters at most; tied parameters stay one parameter. Buffers are broadcast after."""
        import torch.distributed as dist

        from taskfit.strategies.rank_zero_weights import has_meta_tensors

        deepspeed = require_deepspeed()
        cfg = finalize_config(self.config, None, max_steps, self.settings.warmup_steps(max_steps))
        if not has_meta_tensors(module):
            module.to(self.root_device)
        owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        for sub in module.modules():
            for name, p in sub._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((sub, name))
        for sub in _children_first(module):
            for name, p in list(sub._parameters.items()):
                if p is not None and p.is_meta:  # every owner of a tied parameter gets the same new one
                    new = torch.nn.Parameter(torch.empty_like(p, device=self.root_device), p.requires_grad)
                    for owner, attr in owners[id(p)]:
                        owner._parameters[attr] = new
            if next(sub.parameters(recurse=False), None) is not None:  # children are converted: only sub's own
                self._check("partition (zero.Init)",
                            lambda m=sub: deepspeed.zero.Init(module=m, config_dict_or_path=cfg))
        with torch.no_grad():
            for sub in module.modules():
                for name, b in list(sub._buffers.items()):
                    if b is not None:
                        if b.is_meta:
                            b = sub._buffers[name] = torch.empty_like(b, device=self.root_device)
                        self._check("broadcast (buffers)", lambda t=b: dist.broadcast(t, src=0))

    @property
    def builds_own_optimizer(self) -> bool:
        """True when the config has an ``optimizer`` section: DeepSpeed builds the optimizer (and schedule)."""
        return "optimizer" in self.config

    def apply_settings(self, settings: DeepSpeedSettings) -> None:
        """Take the run's settings: the DeepSpeed config the connector resolved from the run's options (a trial
        or a retry may change the batch size, learning rate, ...)."""
        super().apply_settings(settings)
        self.config = settings.config

    def _destroy_engine(self) -> None:
        if self.engine is not None:
            try:
                self.engine.destroy()  # removes the ZeRO gradient hooks from the module's parameters
            except Exception:  # an engine half torn down: nothing else holds it
                log.debug("DeepSpeed engine.destroy() failed", exc_info=True)
            self.engine, self.precision.active = None, False

    def _build_engine(self, module: torch.nn.Module, optimizer: Any, scheduler: Any,
                      max_steps: int) -> tuple[Any, list[Any], list[Any]]:
        deepspeed = require_deepspeed()
        settings = self.settings
        cfg = finalize_config(self.config, None, max_steps, settings.warmup_steps(max_steps))
        kwargs: dict[str, Any] = {"model": StepForward(module), "config": cfg}
        ds_optimizer = "optimizer" in cfg
        if ds_optimizer:
            kwargs["model_parameters"] = self._param_groups(module, settings.weight_decay)
        else:
            kwargs["optimizer"] = optimizer
        engine, ds_opt, _, ds_scheduler = deepspeed.initialize(**kwargs)
        engine.lr_scheduler = None  # the fit loop steps the run's scheduler once per applied step
        if ds_optimizer:  # the run's optimizer/schedule become DeepSpeed's
            optimizer = engine.basic_optimizer
            if ds_scheduler is not None and hasattr(ds_scheduler, "last_batch_iteration") and \
                    ds_scheduler.last_batch_iteration < 0:
                ds_scheduler.step()  # DeepSpeed's schedules start at -1: the first step then runs at the value of
                # iteration 0, as torch/taskfit schedules do (otherwise DeepSpeed repeats it for two steps)
            if ds_scheduler is not None:
                scheduler = ds_scheduler
            else:  # the run's own schedule over DeepSpeed's optimizer (None before the connector configured it)
                scheduler = settings.make_scheduler(optimizer, max_steps) if settings.make_scheduler else None
        if engine.optimizer is not optimizer:  # a ZeRO/bf16 wrapper owns it and clears the gradients
            _keep_engine_grads(optimizer)
        self.engine = self.model = engine
        self.precision.active = True
        log.info("DeepSpeed engine ready: ZeRO stage %d, %s, world size %d, optimizer %s.", self.zero_stage,
                 self.precision.name, self.world_size, type(engine.optimizer).__name__)
        return engine, [optimizer], [scheduler] if scheduler is not None else []

    @staticmethod
    def _param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
        """Weight-decay and no-decay groups, as taskfit's optimizers build them (biases and norms get none)."""
        from taskfit.optim.optimizers import get_decay_parameter_names

        decay = set(get_decay_parameter_names(module))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
        return [g for g in groups if g["params"]]

    def step_function(self, module: torch.nn.Module, name: str) -> Any:
        """``module.<name>`` routed through the engine's ``forward`` (ZeRO-3 gathers parameters there); the plain
        method before the engine exists (e.g. ``validate`` before any ``fit``)."""
        engine = self.engine
        if engine is None or module is not self._module:
            return getattr(module, name)
        return lambda *args: engine(name, *args)

    # -- step -------------------------------------------------------------------------------------------
    def _engine(self) -> Any:
        if self.engine is None:
            raise RuntimeError("The DeepSpeed engine does not exist yet: training steps run only inside fit().")
        return self.engine

    def forward_context(self) -> ContextManager:
        return contextlib.nullcontext()  # the engine holds the module in its dtype

    def no_backward_sync(self, enabled: bool = True) -> ContextManager:
        """Tell the engine, when called, whether the next backward ends the accumulation window (``not enabled``:
        it reduces gradients and may step only then); the loop's window, not the config's
        ``gradient_accumulation_steps``, decides."""
        self._engine().set_gradient_accumulation_boundary(not enabled)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``engine.backward(loss)`` without DeepSpeed's 1/accumulation scaling (the loop already weights each
        micro-batch's loss by its share of the window's items); ``kwargs`` (``retain_graph``) go to the engine."""
        engine = self._engine()
        self._check("backward (gradient reduction)", lambda: engine.backward(loss, *args, scale_wrt_gas=False,
                                                                             **kwargs))

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float, optimizer: Any) -> torch.Tensor:
        """No clipping here: the engine clips to ``gradient_clipping`` (= ``max_grad_norm``) inside ``step``.
        Returns a 0-dim tensor that :meth:`optimizer_step` fills with the engine's global gradient norm (before
        clipping) of this step."""
        self._grad_norm = torch.full((), float("nan"))
        return self._grad_norm

    def optimizer_step(self, optimizer: Any, closure: Any = None, **kwargs: Any) -> bool:
        """``engine.step(**kwargs)`` (reduce, clip, step, zero the gradients); False when the step was skipped
        (fp16 overflow). A ``closure`` runs once first: the engine cannot take one (Lightning's
        ``DeepSpeedPrecision`` does the same)."""
        engine = self._engine()
        if closure is not None:
            closure()
        self._check("optimizer step", lambda: engine.step(**kwargs))
        norm = engine.get_global_grad_norm()
        if norm is not None:
            self._grad_norm.fill_(float(norm))
        return bool(engine.was_step_applied())

    # -- weights ----------------------------------------------------------------------------------------
    def model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of ``module`` (the unwrapped model). ZeRO 0-2 keep full parameters on every rank;
        under ZeRO-3 the parameters are gathered, a collective: every rank calls this (``save_model`` and the
        checkpoint code do)."""
        if self.engine is None or self.zero_stage != 3:
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
        return self._gathered_state_dict(module)

    def _gathered_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        deepspeed = require_deepspeed()
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def adapter_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full tensors of PEFT ``module``'s adapter parameters only; under ZeRO-3 only these are gathered
        (a collective: every rank calls this), never the frozen base."""
        from taskfit.io.peft_files import adapter_parameter_names

        names = adapter_parameter_names(module)
        params = [(n, p) for n, p in module.named_parameters() if n in names]
        if self.engine is None or self.zero_stage != 3:
            return {n: p.detach().clone() for n, p in params}
        deepspeed = require_deepspeed()
        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
            return {n: p.detach().clone() for n, p in params}

    def _is_peft(self, module: torch.nn.Module) -> bool:
        from taskfit.io.peft_files import is_peft_model
        from taskfit.strategies.checkpointing import exportable_model

        return is_peft_model(exportable_model(module))

    # -- checkpoints ------------------------------------------------------------------------------------
    def _prefix(self, module: torch.nn.Module) -> str:
        """Where the exported model sits inside the engine's module (``"module."``, ``"module.model."``, ...)."""
        from taskfit.strategies.checkpointing import exportable_model

        target = exportable_model(module)
        for name, sub in self.engine.module.named_modules():
            if sub is target:
                return f"{name}." if name else ""
        return "module."

    def save_checkpoint_shards(self, module: torch.nn.Module, optimizer: Any, folder: str) -> list[str] | None:
        """``engine.save_checkpoint(folder/shards, tag="deepspeed")`` on every rank, plus
        ``shards/taskfit_deepspeed.json`` (stage, world size, key prefix) from rank 0. Returns the files this rank
        wrote (relative to ``folder``).

        Raises:
            ValueError: ``folder`` is not on the local file system (DeepSpeed writes with ``torch.save``).
        """
        if self.engine is None:
            return None
        if not self.checkpoint_io.is_local(folder):
            raise ValueError(f"DeepSpeed engine checkpoints need a local output_dir; {folder!r} is remote. Save "
                             "locally and copy, or publish with push_to_hub.")
        local = self.checkpoint_io.fs(folder)[1]
        shard_dir = os.path.join(local, "shards")
        from taskfit.strategies.deepspeed_files import trainable_module_state

        # a PEFT model: the trainable adapter only, not the frozen base (as transformers.Trainer saves it), nor
        # what the base's modules write beside their weights (bitsandbytes' quantization constants)
        frozen_out = self._is_peft(module)
        with trainable_module_state(self.engine) if frozen_out else contextlib.nullcontext():
            self._check("save_checkpoint", lambda: self.engine.save_checkpoint(
                shard_dir, tag=TAG, exclude_frozen_parameters=frozen_out))
        if self.is_global_zero:
            meta = {"format": "taskfit-deepspeed", "tag": TAG, "zero_stage": self.zero_stage,
                    "world_size": self.world_size, "prefix": self._prefix(module),
                    "precision": self.precision.name}
            with open(os.path.join(local, META_NAME), "w", encoding="utf-8") as fh:
                json.dump(meta, fh, indent=2)
        self.barrier("deepspeed-save")
        mine = []
        for root, _, files in os.walk(shard_dir):
            for f in files:
                rel = os.path.relpath(os.path.join(root, f), local).replace(os.sep, "/")
                if self._owner(f) == self.global_rank:
                    mine.append(rel)
        return sorted(mine)

    def _owner(self, filename: str) -> int:
        """The rank that wrote an engine file: ``*zero_pp_rank_{r}_*`` files are rank r's, the rest rank 0's."""
        marker = "zero_pp_rank_"
        if marker in filename:
            return int(filename.split(marker, 1)[1].split("_", 1)[0])
        return 0

    def load_checkpoint_shards(self, module: torch.nn.Module, optimizer: Any, folder: str,
                               names: list[str], reader: Any = None) -> bool:
        """Restore module, optimizer and ZeRO state with ``engine.load_checkpoint`` (builds the engine first).
        Every engine file is read once through ``reader`` (a
        :class:`~taskfit.io.checkpoint_format.CheckpointReader`, built when None): verified against the manifest
        and unpickled with ``weights_only=True`` plus DeepSpeed's own classes (see
        :mod:`taskfit.strategies.deepspeed_files`). False when ``names`` holds no DeepSpeed checkpoint.

        Raises:
            ValueError: the checkpoint was written by another world size or ZeRO stage (convert it to full weights
                with ``taskfit convert`` and load those instead) or by another strategy.
            CheckpointError: a missing or corrupted file. UnsafeCheckpointError: a file needs arbitrary unpickling.
        """
        from taskfit.io.checkpoint_format import CheckpointReader
        from taskfit.strategies.deepspeed_files import verified_engine_loads

        if META_NAME not in names:
            return False
        reader = reader or CheckpointReader(self.checkpoint_io, folder)
        local = self.checkpoint_io.fs(folder)[1]
        meta = reader.read(META_NAME)
        if not isinstance(meta, dict) or not {"world_size", "zero_stage", "tag"} <= set(meta):
            raise ValueError(f"{os.path.join(local, META_NAME)!r} is not a taskfit DeepSpeed description.")
        if meta["world_size"] != self.world_size or meta["zero_stage"] != self.zero_stage:
            raise ValueError(f"{folder!r} holds a DeepSpeed ZeRO-{meta['zero_stage']} checkpoint of world size "
                             f"{meta['world_size']}; this run is ZeRO-{self.zero_stage} with world size "
                             f"{self.world_size}. Convert it with `taskfit convert {folder} OUT` and load the full "
                             "weights instead.")
        if meta["tag"] != TAG:
            raise ValueError(f"{os.path.join(local, META_NAME)!r} names the DeepSpeed tag {meta['tag']!r}; taskfit "
                             f"writes {TAG!r}.")
        engine = self.engine
        if engine is None:
            raise RuntimeError("DeepSpeed checkpoints are restored inside fit() (the engine needs the optimizer).")
        with verified_engine_loads(engine, reader, local):
            path, _ = self._check("load_checkpoint", lambda: engine.load_checkpoint(
                os.path.join(local, "shards"), tag=TAG, load_optimizer_states=True,
                load_lr_scheduler_states=False, load_module_strict=not self._is_peft(module)))
        if path is None:
            raise ValueError(f"DeepSpeed could not load the engine checkpoint in {folder!r}/shards.")
        return True

    def teardown(self) -> None:
        """End of a stage: as :class:`Strategy`; the engine stays for a later ``validate``/``test``/``predict`` of
        its module and is destroyed when the next ``fit`` builds a new one."""
        super().teardown()


def _children_first(module: torch.nn.Module) -> list[torch.nn.Module]:
    """``module`` and its submodules, each once, every module after its children (children in definition order)."""
    seen: set[int] = set()
    order: list[torch.nn.Module] = []

    def visit(m: torch.nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            visit(child)
        order.append(m)

    visit(module)
    return order
