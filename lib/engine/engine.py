"""``Engine``: taskfit's accelerators, strategies, precision plugins, launchers, loggers and checkpoint format for
users who write the training loop themselves (mirrors Lightning Fabric and Hugging Face Accelerate).

The Engine is a second client of the Strategy contract next to ``Fit``: the same connector builds the same
strategy, accelerator and precision objects from the same names, and the Engine calls only the contract
(``launch``, ``setup``, ``no_backward_sync``, ``backward``, ``clip_gradients``, ``optimizer_step``, collectives,
``save_checkpoint``/``load_checkpoint``, ``teardown``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Mapping
from typing import Any, Callable, ContextManager

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from lightning_utilities.core.rank_zero import rank_zero_only
from torch import nn

from taskfit.fit.topology import Topology
from taskfit.engine.wrappers import (
    EngineDataLoader, EngineModule, EngineOptimizer, unwrap_module, unwrap_optimizer,
)

_COMPONENTS = ("accelerator", "strategy", "devices", "num_nodes")
_REDUCE_OPS = ("mean", "sum", "max", "min")  # what Strategy.reduce accepts


class Engine(Topology):
    """Run your own training loop on taskfit's strategies (mirrors Lightning's ``Fabric``).

    Args:
        accelerator (str | Accelerator): ``"auto"``, ``"cpu"``, ``"cuda"``/``"gpu"``, ``"mps"``, ``"xla"``/``"tpu"``
            or an instance (the names ``Fit`` takes).
        strategy (str | Strategy): ``"auto"``, ``"single_device"``, ``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``,
            ``"deepspeed"``, ``"deepspeed_stage_2"``... or an instance.
        devices (int | str | list): devices (on the CPU: processes) per node; ``"auto"``.
        num_nodes (int): machines.
        precision (str | Precision | None): ``"32-true"`` (None), ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``,
            ``"16-true"``, ``"64-true"``, or a plugin instance.
        plugins (list | None): ``Precision`` / ``CheckpointIO`` instances.
        loggers (Logger | list[Logger] | None): where :meth:`log` / :meth:`log_dict` go (rank zero only).
        **options: the ``FitArguments`` options the strategy reads (``fsdp``, ``fsdp_config``, ``deepspeed`` (a
            config), ``ddp_timeout``, ``ddp_backend``, ``save_safetensors``..., and the values a DeepSpeed config's
            ``"auto"`` entries take: ``max_grad_norm`` (DeepSpeed clips inside its step; default 0, no
            clipping), ``learning_rate``, ``optim``...; see ``StrategyOptions``), plus ``report_to``,
            ``logging_dir``, ``run_name``, ``output_dir`` and ``max_steps`` (see ``EngineOptions``). Each value is
            checked as ``FitArguments`` checks it; no ``FitArguments`` is built.

    Attributes:
        options (StrategyOptions): the strategy's options, resolved once.
        engine_options (EngineOptions): the Engine's own options.

    Raises:
        ValueError: an unknown name (with the valid choices and the closest match), a conflicting pair, a bad
            value, or an option the Engine does not read (a ``FitArguments`` option of the training loop, or an
            unknown name with the closest ones); all before any work, as ``Fit`` raises them.
        TypeError: a plugin or logger of an unknown kind.
    """

    def __init__(self, accelerator: Any = "auto", strategy: Any = "auto", devices: Any = "auto", num_nodes: int = 1,
                 precision: Any = None, plugins: list[Any] | None = None, loggers: Any = None,
                 **options: Any) -> None:
        from taskfit.connector import resolve_components
        from taskfit.engine.options import engine_options
        from taskfit.loggers import build_loggers
        from taskfit.precision import Precision

        plugins = list(plugins or [])
        instances: dict[str, Any] = {}
        fields = dict(options)
        for key, value in zip(_COMPONENTS, (accelerator, strategy, devices, num_nodes)):
            if isinstance(value, (str, int, list, tuple)):
                fields[key] = list(value) if isinstance(value, tuple) else value
            elif value is not None:
                instances[key] = value
        if isinstance(precision, Precision):
            plugins.append(precision)
        elif precision is not None:
            fields["precision"] = precision
        self.options, self.engine_options = engine_options(fields)  # unknown names: "did you mean"
        self.strategy = resolve_components(self.options, plugins, **{k: v for k, v in instances.items()
                                                                     if k in ("accelerator", "strategy")})
        rank_zero_only.rank = self.strategy.global_rank
        if loggers is not None and not isinstance(loggers, (list, tuple)):
            loggers = [loggers]
        self.loggers = build_loggers(self.engine_options, list(loggers or []))
        self._launched = False
        self._log_step = 0
        self._models: list[EngineModule] = []
        self._inside_no_backward_sync = False

    # -- topology (global_rank, local_rank, node_rank, world_size, is_global_zero: ``Topology``) ----------
    @property
    def device(self) -> torch.device:
        """This process's device."""
        return self.strategy.root_device

    # -- launching --------------------------------------------------------------------------------------
    def launch(self, fn: Callable[..., Any] | None = None, *args: Any) -> Any:
        """Start the run's processes and join them (the process group, the device of each). Mirrors
        ``Fabric.launch``; what runs where:

        - ``python train.py`` with a multi-process strategy (``"ddp"``, ``"fsdp"``, ``"deepspeed"``...): the other
          ranks are started as copies of the running command, which run the whole script from the top, so the code
          above ``launch()`` runs once in every process. Until ``launch()``, no process has ``LOCAL_RANK``,
          ``WORLD_SIZE`` or ``LOCAL_WORLD_SIZE`` in its environment, so a library that forms a process group when
          it sees them (Accelerate's ``PartialState``, which ``transformers.TrainingArguments`` builds; DeepSpeed;
          ``torch.distributed``'s ``env://``) does so in no process, and every process builds the same objects.
          ``RANK`` is set in the workers from their start (``os.environ.get("RANK", "0")`` is right everywhere);
          :attr:`global_rank` and :attr:`is_global_zero` are right from the Engine's construction. ``launch()``
          exports the variables, forms the process group and every process continues after it.
        - Under ``torchrun``, SLURM's ``srun`` or the ``deepspeed`` launcher, that launcher set the variables before
          the script started: code above ``launch()`` sees them in every process (as with Accelerate), a library
          may form the process group there (on every rank alike) and ``launch()`` then joins that group.
        - With ``fn``, ``fn(engine, *args)`` runs on every process after the launch and this process's result is
          returned. ``strategy="ddp_spawn"`` needs ``fn``: only ``fn`` runs in the spawned workers (rank 0's result
          comes back; ``fn`` and ``args`` must pickle), the script's top level runs only in this process and must
          sit under ``if __name__ == "__main__":``.

        Every process computes with the same number of torch threads (``torch.set_num_threads``, this process
        included): ``OMP_NUM_THREADS`` when set, else the machine's cores divided by the processes on it.

        Raises:
            RuntimeError: called twice, or ``ddp_spawn`` without ``fn``.
            TypeError: ``fn`` is not callable.
            ValueError: ``OMP_NUM_THREADS`` is set but not a positive integer.
        """
        if self._launched:
            raise RuntimeError("Engine.launch() was already called for this Engine.")
        if fn is not None and not callable(fn):
            raise TypeError(f"launch(fn) needs a callable; got {type(fn).__name__}.")
        from taskfit.connector import configure_strategy
        from taskfit.strategies.launchers import MultiprocessingLauncher

        spawns = isinstance(self.strategy.launcher, MultiprocessingLauncher) and \
            not os.environ.get("TASKFIT_LAUNCHED")
        if fn is None and spawns:
            raise RuntimeError(f"strategy={self.strategy.name!r} runs the work in spawned processes: pass the "
                               "function to run, engine.launch(fn) (fn(engine, *args)), or use strategy='ddp'.")
        configure_strategy(self.strategy, self.options)
        if fn is None:
            self.strategy.launch(self._join)
            return None
        return self.strategy.launch(self._run, fn, *args)

    def _join(self) -> None:
        self.strategy.setup_environment()
        rank_zero_only.rank = self.strategy.global_rank
        self._launched = True

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._join()
        return fn(self, *args)

    def _ensure_launched(self, what: str) -> None:
        if self._launched:
            return
        if self.strategy.parallel:
            raise RuntimeError(f"Call engine.launch() before engine.{what}(): strategy={self.strategy.name!r} runs "
                               "several processes.")
        self._join()  # one process: nothing to start, prepare the device

    # -- set-up -----------------------------------------------------------------------------------------
    def setup(self, module: nn.Module, *optimizers: torch.optim.Optimizer, scheduler: Any = None,
              max_steps: int | None = None) -> Any:
        """Place and wrap ``module`` and bind ``optimizers`` (built over its parameters) through the strategy
        (DDP/FSDP wrapping, the DeepSpeed engine, precision conversion). Mirrors ``Fabric.setup``.

        Args:
            module (nn.Module): the model (not yet set up).
            *optimizers (torch.optim.Optimizer): its optimizers (DeepSpeed: at most one).
            scheduler (LRScheduler | None): returned last, re-bound when the backend replaces the optimizer.
            max_steps (int | None): optimizer steps of the run, for a DeepSpeed config's own schedule.

        Returns:
            ``EngineModule`` alone without optimizers, else ``(EngineModule, EngineOptimizer, ...)`` (plus the
            scheduler when given).

        Raises:
            TypeError: ``module`` is not an ``nn.Module`` or an optimizer is not a ``torch.optim.Optimizer``.
            ValueError: ``module`` was already set up, a second module under a multi-process strategy, or more
                optimizers than the strategy supports; a quantized model (bitsandbytes 4/8-bit) with optimizers but
                no adapters (as ``transformers.Trainer`` refuses it), or under a strategy that shards or flattens
                parameters (``"fsdp"``, DeepSpeed: naming it), before any weight moves or process starts.
            RuntimeError: a multi-process strategy before :meth:`launch`.
        """
        from taskfit.core.quantized import check_quantized_setup
        from taskfit.strategies.checkpointing import exportable_model

        if isinstance(module, EngineModule):
            raise ValueError("This module was already set up by engine.setup(); pass the original module.")
        if not isinstance(module, nn.Module):
            raise TypeError(f"engine.setup(module, ...) needs an nn.Module; got {type(module).__name__}.")
        for i, opt in enumerate(optimizers):
            if isinstance(opt, EngineOptimizer):
                raise ValueError(f"Optimizer {i} was already set up by engine.setup(); pass the original optimizer.")
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"engine.setup(module, *optimizers): optimizer {i} is a {type(opt).__name__}, not "
                                "a torch.optim.Optimizer.")
        if self.strategy.parallel and any(m.module is not module for m in self._models):
            # the strategy's gradient-sync control (no_backward_sync) acts on the one module it wrapped last
            raise ValueError(f"strategy={self.strategy.name!r} wraps one module per Engine; this Engine already set up "
                             f"{type(self._models[0].module).__name__}. Put the modules into one nn.Module (e.g. "
                             "nn.ModuleDict) and set that up, with one optimizer per part if needed.")
        # the checks Fit runs on its model (one mechanism): before launch() too, so no process starts in vain
        check_quantized_setup(exportable_model(module), self.strategy, training=bool(optimizers))
        self._ensure_launched("setup")
        steps = max_steps if max_steps is not None else max(int(self.engine_options.max_steps or 0), 1)
        wrapped, opts, scheds = self.strategy.setup(module, list(optimizers),
                                                    [scheduler] if scheduler is not None else [], max_steps=steps)
        model = EngineModule(wrapped, module, self.strategy)
        self._models.append(model)
        if not optimizers:
            return model
        out: list[Any] = [model, *(EngineOptimizer(o, self.strategy) for o in opts)]
        if scheduler is not None:
            out.append(scheds[0] if scheds else scheduler)
        return tuple(out)

    def setup_dataloaders(self, *dataloaders: Any, use_distributed_sampler: bool = True,
                          move_to_device: bool = True) -> Any:
        """Give this process its share of each loader (a distributed sampler over the loader's own order: every
        process must build the same order, e.g. the same seed for ``shuffle=True``) and move its batches to
        :attr:`device`. Mirrors ``Fabric.setup_dataloaders``.

        Returns:
            One ``EngineDataLoader`` per loader (a single one unpacked).

        Raises:
            ValueError: no loader given, or (several processes) a loader with a custom ``batch_sampler``.
        """
        if not dataloaders:
            raise ValueError("setup_dataloaders() needs at least one DataLoader.")
        out = []
        for loader in dataloaders:
            if use_distributed_sampler:
                loader = self.strategy.process_dataloader(loader)
            out.append(EngineDataLoader(loader, self.strategy, move_to_device))
        return out[0] if len(out) == 1 else tuple(out)

    # -- the step ---------------------------------------------------------------------------------------
    def no_backward_sync(self, module: EngineModule, enabled: bool = True) -> ContextManager:
        """Inside, backward passes accumulate gradients locally without the all-reduce (DDP ``no_sync``, FSDP
        ``set_requires_gradient_sync(False)``, DeepSpeed: not an accumulation boundary). Use it on every
        micro-batch of an accumulation window but the last (``enabled=not last``). A no-op on one process.
        Mirrors ``Fabric.no_backward_sync``.

        Raises:
            TypeError: ``module`` was not returned by :meth:`setup`.
        """
        if not isinstance(module, EngineModule):
            raise TypeError(f"no_backward_sync(module) needs the module engine.setup() returned; got "
                            f"{type(module).__name__}.")
        if not self.strategy.engine_owns_step:
            return self.strategy.no_backward_sync(enabled)
        return self._engine_window(enabled)

    @contextlib.contextmanager
    def _engine_window(self, enabled: bool) -> Generator[None, None, None]:
        # the engine keeps the boundary flag until told otherwise: backward outside this block re-opens it
        self._inside_no_backward_sync = True
        try:
            with self.strategy.no_backward_sync(enabled):
                yield
        finally:
            self._inside_no_backward_sync = False

    def backward(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate the scalar ``tensor`` through the strategy: the precision plugin's loss scaling
        (``"16-mixed"``) or the DeepSpeed engine's backward. Replaces ``loss.backward()``."""
        if self.strategy.engine_owns_step and not self._inside_no_backward_sync:
            self.strategy.no_backward_sync(False)  # a backward outside no_backward_sync ends its accumulation window
        self.strategy.backward(tensor)

    def clip_gradients(self, module: EngineModule, optimizer: Any, max_norm: float | None = None,
                       clip_val: float | None = None) -> torch.Tensor | None:
        """Clip the gradients of ``optimizer``'s parameters: the global L2 norm to ``max_norm`` (across shards and
        processes; returns the norm before clipping, a 0-dim tensor, no host sync) or each value to
        ``[-clip_val, clip_val]`` (returns None). Gradients are unscaled first under ``"16-mixed"``. Mirrors
        ``Fabric.clip_gradients`` / ``torch.nn.utils.clip_grad_norm_``.

        Raises:
            ValueError: neither or both of ``max_norm`` and ``clip_val``, a value <= 0, or a strategy whose engine
                clips inside its step (DeepSpeed: pass ``max_grad_norm=`` to ``Engine`` instead).
        """
        if (max_norm is None) == (clip_val is None):
            raise ValueError("clip_gradients needs exactly one of max_norm= (L2 norm) and clip_val= (value); got "
                             f"max_norm={max_norm!r}, clip_val={clip_val!r}.")
        bound = max_norm if max_norm is not None else clip_val
        if not bound > 0:
            raise ValueError(f"clip_gradients: {'max_norm' if max_norm is not None else 'clip_val'}={bound!r} must "
                             "be > 0.")
        if self.strategy.engine_owns_step:
            raise ValueError(f"strategy={self.strategy.name!r} clips gradients inside its optimizer step: pass "
                             f"max_grad_norm={bound} to Engine(...) (DeepSpeed's gradient_clipping) instead of "
                             "calling clip_gradients.")
        opt = unwrap_optimizer(optimizer)
        params = [p for group in opt.param_groups for p in group["params"]]
        self.strategy.unscale_gradients(opt)  # clipping reads true gradients (once per step: tracked)
        if max_norm is not None:
            return self.strategy.clip_gradients(params, float(max_norm), opt)
        self.strategy.clip_gradients_value(params, float(clip_val), opt)
        return None

    def autocast(self) -> ContextManager:
        """The precision plugin's forward context (``torch.autocast`` under mixed precision), for computations
        outside the set-up module's ``forward`` (a loss function, a second model). Mirrors ``Fabric.autocast``."""
        return self.strategy.forward_context()

    def to_device(self, obj: Any) -> Any:
        """``obj`` (a module, a tensor, or any collection of tensors) on :attr:`device`."""
        if isinstance(obj, nn.Module):
            return obj.to(self.device)
        device = self.device
        return apply_to_collection(obj, torch.Tensor, lambda t: t.to(device))

    # -- collectives ------------------------------------------------------------------------------------
    def all_reduce(self, data: Any, reduce_op: str = "mean") -> Any:
        """Reduce every tensor of ``data`` (a tensor or a collection; numbers become tensors) over all processes
        with ``reduce_op`` in ``"mean"``/``"sum"``/``"max"``/``"min"``.

        Raises:
            ValueError: another ``reduce_op``.
        """
        if reduce_op not in _REDUCE_OPS:
            from taskfit.registry import invalid_choice

            raise invalid_choice("reduce_op", reduce_op, _REDUCE_OPS)
        data = apply_to_collection(data, (int, float), lambda x: torch.tensor(x, device=self.device))
        return apply_to_collection(data, torch.Tensor, lambda t: self.strategy.reduce(t, reduce_op))

    def all_gather(self, data: Any) -> Any:
        """Every tensor of ``data`` from all processes, stacked along a new first dimension of size
        :attr:`world_size`."""
        data = apply_to_collection(data, (int, float), lambda x: torch.tensor(x, device=self.device))
        return apply_to_collection(data, torch.Tensor, lambda t: self.strategy.all_gather(t))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """The picklable ``obj`` of process ``src`` on every process."""
        return self.strategy.broadcast(obj, src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here."""
        self.strategy.barrier(name)

    @contextlib.contextmanager
    def rank_zero_first(self, local: bool = False) -> Generator[None, None, None]:
        """Run the block on (local, with ``local=True``) rank zero first, then on the others (e.g. a download or
        a cache build). Mirrors ``Fabric.rank_zero_first``."""
        first = self.local_rank == 0 if local else self.is_global_zero
        if not first:
            self.barrier("rank_zero_first")
        yield
        if first:
            self.barrier("rank_zero_first")

    def rank_zero_init(self) -> ContextManager[bool]:
        """Build the model inside this block (before :meth:`setup`): real weights on global rank 0, the meta device
        (no memory) elsewhere; :meth:`setup` under ``"fsdp"``/``"ddp"`` fills the other ranks from rank 0. Yields
        True on rank 0. See :func:`taskfit.core.rank_zero_init.rank_zero_init` (HF ``cpu_ram_efficient_loading``;
        Fabric's ``init_module(empty_init=True)`` with rank 0's weights kept)."""
        from taskfit.core.rank_zero_init import rank_zero_init

        return rank_zero_init(self.global_rank)

    # -- output -----------------------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank zero only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar to every logger (rank zero only); see :meth:`log_dict`."""
        self.log_dict({name: value}, step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send ``metrics`` (name -> number or 0-dim tensor; a tensor costs one host sync here) to every logger at
        ``step`` (default: a counter of log calls), on rank zero only."""
        if step is None:
            step = self._log_step
            self._log_step += 1
        if not self.loggers or not self.is_global_zero:
            return
        values = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        for logger in self.loggers:
            logger.log_metrics(values, int(step))

    def seed_everything(self, seed: int) -> int:
        """Seed ``random``, ``numpy`` and ``torch`` with ``seed`` (the same on every process, so shuffled loaders
        agree); returns it."""
        from taskfit.seed import seed_everything

        seed_everything(int(seed))
        return int(seed)

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, state: dict[str, Any]) -> str:
        """Write ``state`` (``{"model": model, "optimizer": optimizer, "step": step, ...}``: one set-up module,
        optimizers, LR schedulers, plain values) to the checkpoint folder ``path`` (local or fsspec URL) in
        taskfit's checkpoint format, with every process's RNG states; ``Fit(resume_from_checkpoint=path)`` can
        continue from it. Every process must call it. Returns ``path``.

        Raises:
            TypeError: ``state`` is not a dict with str keys.
            ValueError: more than one module in ``state``.
        """
        from taskfit.engine import checkpoint as engine_checkpoint
        from taskfit.engine.options import options_record

        return engine_checkpoint.save(self.strategy, self.options, os.fspath(path), state,
                                      options_record(self.options, self.engine_options))

    def load(self, path: str | os.PathLike, state: dict[str, Any] | None = None, strict: bool = True,
             weights_only: bool = True) -> dict[str, Any]:
        """Restore the checkpoint folder ``path`` (from :meth:`save` or a ``Fit`` run) into ``state``: module and
        optimizers in place, plain values replaced in ``state``, RNG states and the loss scaler restored (exact
        resume). Returns the saved values not in ``state``. Every process must call it.

        Raises:
            CheckpointError: a missing, incomplete or corrupted checkpoint (names the file).
            KeyError: with ``strict``, a value key the checkpoint lacks.
        """
        from taskfit.engine import checkpoint as engine_checkpoint

        return engine_checkpoint.load(self.strategy, os.fspath(path), {} if state is None else state, strict,
                                      weights_only)

    def teardown(self) -> None:
        """Release the strategy's resources (background checkpoint IO, device caches) and close the loggers."""
        try:
            self.strategy.teardown()
        finally:
            for logger in self.loggers:
                logger.finalize("success")


__all__ = ["Engine", "EngineDataLoader", "EngineModule", "EngineOptimizer", "unwrap_module"]
