"""DeepSpeed ZeRO (``strategy="deepspeed"``, ``"deepspeed_stage_1|2|3"``, ``"..._offload"``, HF ``deepspeed=``;
F-STRAT-6, F-CKPT-5, F-PREC-3). Mirrors Lightning's ``DeepSpeedStrategy`` and the HF Trainer's DeepSpeed
integration.

The engine owns backward (``engine.backward``), gradient reduction, accumulation boundaries, clipping
(``gradient_clipping`` <- ``max_grad_norm``) and the optimizer step (``engine.step``); the fit loop still decides
where a window ends (:meth:`DeepSpeedStrategy.no_sync` sets the engine's boundary for every micro-batch, so the
shorter last window of an epoch is one optimizer step as everywhere else) and steps the LR schedule after each
applied step (a DeepSpeed schedule from the config becomes ``fit.lr_scheduler``; the engine does not step it too).

The engine is built once the run's optimizer exists (the first ``training_step``/``validation_step`` routed
through the strategy inside ``fit``, or the restore of a checkpoint), from the taskfit optimizer (handed to
``deepspeed.initialize``) or, when the config has an ``optimizer`` section (always with optimizer offload), from
DeepSpeed's own optimizer (``fit.optimizer`` then becomes that optimizer and ``fit.lr_scheduler`` its schedule).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, ContextManager

import torch
from lightning_utilities.core.imports import RequirementCache

from taskfit.precision.precision import Precision
from taskfit.strategies.deepspeed_config import DS_PRECISIONS, finalize_config, resolve_config
from taskfit.strategies.parallel import ParallelStrategy
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


class DeepSpeedPrecision(Precision):
    """Precision under DeepSpeed: the engine converts the module (``bf16``/``fp16`` config sections) and scales
    losses, so this plugin only casts floating-point inputs to the engine's dtype once the engine exists.

    Args:
        name (str): the run's precision name (``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ...).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        half = DS_PRECISIONS.get(name)
        self.engine_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(half) if half else None
        self.param_dtype = None  # the module stays as it is until deepspeed.initialize converts it
        self.active = False

    def convert_input(self, data: Any) -> Any:
        if not self.active or self.engine_dtype is None:
            return data
        from lightning_utilities.core.apply_func import apply_to_collection

        dtype = self.engine_dtype
        return apply_to_collection(data, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)


class DeepSpeedStrategy(ParallelStrategy):
    """DeepSpeed ZeRO data parallelism over ``devices`` x ``num_nodes`` processes (gloo and DeepSpeed's CPU
    accelerator on CPU machines).

    Args:
        *args: as :class:`ParallelStrategy` (accelerator, devices, precision, checkpoint_io, num_nodes, args).
        config (dict | str | None): a DeepSpeed config (dict, JSON string or JSON file path); default
            ``args.deepspeed`` (HF ``deepspeed=``). ``"auto"`` values are filled from the arguments
            (:func:`taskfit.strategies.deepspeed_config.resolve_config` lists the mapping).
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

    def __init__(self, *args: Any, config: Any = None, stage: int | None = None, offload_optimizer: str | None = None,
                 offload_parameters: str | None = None, nvme_path: str | None = None, **kwargs: Any) -> None:
        require_deepspeed()
        super().__init__(*args, **kwargs)
        fit_args = self.args
        raw = config if config is not None else getattr(fit_args, "deepspeed", None)
        self.config = resolve_config(
            raw, fit_args, world_size=self.world_size, precision=self.precision.name, stage=stage,
            offload_optimizer=offload_optimizer, offload_parameters=offload_parameters,
            nvme_path=nvme_path or "/local_nvme", on_cpu=self.root_device.type == "cpu")
        self.precision = DeepSpeedPrecision(self.precision.name)
        self.engine: Any = None
        self._module: torch.nn.Module | None = None
        self._optimizer: Any = None  # the optimizer fit.optimizer must be for the engine to be current
        self._grad_norm = torch.zeros(())

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage (0-3) of the resolved config."""
        return int(self.config["zero_optimization"]["stage"])

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

    def setup(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to this process's device; the engine wraps it later (see the module docstring), since
        ``deepspeed.initialize`` needs the run's optimizer."""
        self._module = module.to(self.root_device)
        self.model = self._module
        return self._module

    def _ensure_engine(self, module: torch.nn.Module) -> Any:
        """The engine, built on first use inside ``fit`` (None outside it: plain forward passes then).

        Raises:
            RuntimeError: ``fit`` was called again on the same ``Fit`` (one engine per ``Fit``).
            ValueError: the config has an ``optimizer`` section and the module or ``optimizers=`` define one too.
        """
        fit = getattr(module, "_fit", None)
        if fit is None or fit.optimizer is None:
            return self.engine
        if self.engine is not None:
            if fit.optimizer is not self._optimizer:
                raise RuntimeError("DeepSpeedStrategy builds one engine per Fit and it is bound to the first fit() "
                                   "call's optimizer; create a new Fit (and model) for another run.")
            return self.engine
        self.engine = self._build_engine(fit, module)
        return self.engine

    def _build_engine(self, fit: Any, module: torch.nn.Module) -> Any:
        deepspeed = require_deepspeed()
        from taskfit.optim.schedulers import create_scheduler, get_warmup_steps

        max_steps = int(fit.state.max_steps)
        cfg = finalize_config(self.config, fit.args, max_steps, get_warmup_steps(fit.args, max_steps))
        kwargs: dict[str, Any] = {"model": StepForward(module), "config": cfg}
        ds_optimizer = "optimizer" in cfg
        if ds_optimizer:
            from taskfit.module import TaskModule

            if fit._optimizers[0] is not None or type(module).configure_optimizers is not TaskModule.configure_optimizers:
                raise ValueError("The DeepSpeed config has an 'optimizer' section, but the module's "
                                 "configure_optimizers or Fit(optimizers=...) define an optimizer too; drop one of "
                                 "them.")
            kwargs["model_parameters"] = self._param_groups(module, fit.args.weight_decay)
        else:
            kwargs["optimizer"] = fit.optimizer
        engine, optimizer, _, scheduler = deepspeed.initialize(**kwargs)
        engine.lr_scheduler = None  # the fit loop steps fit.lr_scheduler once per applied step
        if ds_optimizer:  # fit's optimizer/schedule become DeepSpeed's (the taskfit ones were never stepped)
            basic = engine.basic_optimizer
            fit.optimizer = basic
            if scheduler is not None and hasattr(scheduler, "last_batch_iteration") and scheduler.last_batch_iteration < 0:
                scheduler.step()  # DeepSpeed's schedules start at -1: the first step then runs at the value of
                # iteration 0, as torch/taskfit schedules do (otherwise DeepSpeed repeats it for two steps)
            fit.lr_scheduler = scheduler if scheduler is not None else create_scheduler(basic, fit.args, max_steps)
            fit.scheduler_interval = "step"
        if engine.optimizer is not fit.optimizer:  # a ZeRO/bf16 wrapper owns it and clears the gradients
            _keep_engine_grads(fit.optimizer)
        self._optimizer = fit.optimizer
        self.model = engine
        self.precision.active = True
        log.info("DeepSpeed engine ready: ZeRO stage %d, %s, world size %d, optimizer %s.", self.zero_stage,
                 self.precision.name, self.world_size, type(engine.optimizer).__name__)
        return engine

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
        engine = self._ensure_engine(module)
        if engine is None:
            return getattr(module, name)
        return lambda *args: engine(name, *args)

    # -- step -------------------------------------------------------------------------------------------
    def _engine(self) -> Any:
        if self.engine is None and self._module is not None:
            self._ensure_engine(self._module)
        if self.engine is None:
            raise RuntimeError("The DeepSpeed engine does not exist yet: training steps run only inside fit().")
        return self.engine

    def forward_context(self) -> ContextManager:
        return contextlib.nullcontext()  # the engine holds the module in its dtype

    def no_sync(self, micro_batch_is_last: bool) -> ContextManager:
        """Tell the engine whether this micro-batch ends the accumulation window (it reduces gradients and may
        step only then); the loop's window, not the config's ``gradient_accumulation_steps``, decides."""
        self._engine().set_gradient_accumulation_boundary(bool(micro_batch_is_last))
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward(loss)`` without DeepSpeed's 1/accumulation scaling (the loop already weights each
        micro-batch's loss by its share of the window's items)."""
        engine = self._engine()
        self._check("backward (gradient reduction)", lambda: engine.backward(loss, scale_wrt_gas=False))

    def clip_gradients(self, parameters: list[torch.Tensor], max_norm: float, optimizer: Any) -> torch.Tensor:
        """No clipping here: the engine clips to ``gradient_clipping`` (= ``max_grad_norm``) inside ``step``.
        Returns a 0-dim tensor that :meth:`optimizer_step` fills with the engine's global gradient norm (before
        clipping) of this step."""
        self._grad_norm = torch.full((), float("nan"))
        return self._grad_norm

    def optimizer_step(self, optimizer: Any) -> bool:
        """``engine.step()`` (reduce, clip, step, zero the gradients); False when the step was skipped (fp16
        overflow)."""
        engine = self._engine()
        self._check("optimizer step", engine.step)
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

    # -- checkpoints ------------------------------------------------------------------------------------
    def _prefix(self, module: torch.nn.Module) -> str:
        """Where the exported model sits inside the engine's module (``"module."``, ``"module.model."``, ...)."""
        from taskfit.checkpoint import exportable_model

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
        self._check("save_checkpoint", lambda: self.engine.save_checkpoint(shard_dir, tag=TAG))
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
        engine = self._ensure_engine(self._module)
        if engine is None:
            raise RuntimeError("DeepSpeed checkpoints are restored inside fit() (the engine needs the optimizer).")
        with verified_engine_loads(engine, reader, local):
            path, _ = self._check("load_checkpoint", lambda: engine.load_checkpoint(
                os.path.join(local, "shards"), tag=TAG, load_optimizer_states=True,
                load_lr_scheduler_states=False, load_module_strict=True))
        if path is None:
            raise ValueError(f"DeepSpeed could not load the engine checkpoint in {folder!r}/shards.")
        return True

    def teardown(self) -> None:
        self.engine = None
        super().teardown()
