"""Resolves ``Fit``'s accelerator / strategy / devices / precision / plugins into concrete objects and checks
they fit together before any work starts (DESIGN.md "Registries")."""

from __future__ import annotations

import functools
from typing import Any, Callable

from taskfit.accelerators import ACCELERATORS, Accelerator, choose_accelerator
from taskfit.arguments.strategy_options import ScheduleOptions, StrategyOptions, as_strategy_options
from taskfit.io import CHECKPOINT_IO, CheckpointIO
from taskfit.precision import Precision, build_precision
from taskfit.strategies import STRATEGIES, Strategy
from taskfit.strategies.settings import (
    DDPSettings, DeepSpeedSettings, FSDPSettings, ProcessGroupSettings, StrategySettings, XLAFSDPSettings,
)


def _name_or_instance(value: Any, kind: type, what: str) -> tuple[str | None, Any]:
    if isinstance(value, kind):
        return None, value
    if isinstance(value, str):
        return value.strip().lower() if what != "precision" else value.strip(), None
    raise TypeError(f"{what} must be a name or a {kind.__name__} instance; got {type(value).__name__}.")


def resolve_components(options: StrategyOptions | Any, plugins: list[Any] | None = None,
                       accelerator: Accelerator | None = None, strategy: Strategy | None = None) -> Strategy:
    """Build the strategy (which owns accelerator, precision and checkpoint IO) for ``options`` and apply the
    settings it reads (:func:`configure_strategy`).

    ``options.accelerator``/``strategy``/``precision`` are registry names; ``accelerator``/``strategy`` instances
    override them, and ``plugins`` may hold a ``Precision`` or ``CheckpointIO`` instance. Mirrors Lightning's
    ``_AcceleratorConnector``.

    Args:
        options (StrategyOptions | FitArguments): the run's options (``FitArguments`` are read through
            :meth:`StrategyOptions.from_arguments`).
        plugins (list | None): ``Precision`` / ``CheckpointIO`` instances.
        accelerator (Accelerator | None), strategy (Strategy | None): instances that replace the named ones.

    Raises:
        ValueError: an unknown name (with the valid choices and the closest match), a conflicting pair, or
            ``devices`` asking for more than one process under a single-device strategy.
        NotImplementedError: a known name whose component has not landed yet (names the issue).
        TypeError: a plugin of an unknown kind.
    """
    opts = as_strategy_options(options)
    precision_plugin, ckpt_plugin = _split_plugins(plugins)
    accelerator = _resolve_accelerator(opts, accelerator)
    devices = accelerator.parse_devices(_devices_value(opts, accelerator))

    strat_name, strategy = _name_or_instance(strategy or opts.strategy, Strategy, "strategy")
    extra: dict[str, Any] = {}
    if strategy is not None and strategy.deferred is not None:
        # an object given only its own options (``ModelParallelStrategy(data_parallel_size=2, ...)``, as in
        # Lightning): built here from them like the named strategy, with Fit's accelerator, devices and precision
        strat_name, extra, strategy = strategy.name, dict(strategy.deferred), None
    if strategy is not None and (precision_plugin is not None or ckpt_plugin is not None
                                 or opts.precision is not None):
        raise ValueError("A Strategy instance owns its precision and checkpoint IO: give them to the strategy, "
                         "not as precision=/plugins= (or pass the strategy by name).")
    if strategy is None:
        strat_name = _accelerator_strategy(accelerator, _hf_strategy_name(opts, strat_name), opts)
        strategy = _build_strategy(opts, strat_name, accelerator, devices, precision_plugin, ckpt_plugin, extra)
    configure_strategy(strategy, opts)
    strategy.precision.setup_device(strategy.root_device)  # e.g. 16-mixed: the GradScaler, or a clear error
    _warn_launcher_mismatch(opts, strategy, len(devices))
    return strategy


def _warn_launcher_mismatch(opts: StrategyOptions, strategy: Strategy, num_devices: int) -> None:
    """Warn when torchrun & co. started another number of processes than the explicit ``devices`` asks for."""
    import warnings

    from taskfit.strategies.environments import launcher_mismatch

    if getattr(strategy, "name", "").startswith("xla"):
        return  # PJRT counts its replicas itself
    message = launcher_mismatch(opts.devices, num_devices, int(opts.num_nodes or 1), strategy.name,
                                bool(strategy.parallel))
    if message:
        warnings.warn(message, UserWarning, stacklevel=3)


def _split_plugins(plugins: list[Any] | None) -> tuple[Precision | None, CheckpointIO | None]:
    """``(precision plugin, checkpoint IO)`` among ``plugins``.

    Raises:
        TypeError: a plugin of another kind.
    """
    precision_plugin, ckpt_plugin = None, None
    for p in plugins or []:
        if isinstance(p, Precision):
            precision_plugin = p
        elif isinstance(p, CheckpointIO):
            ckpt_plugin = p
        else:
            raise TypeError(f"Unsupported plugin {type(p).__name__}: pass Precision or CheckpointIO instances.")
    return precision_plugin, ckpt_plugin


def _resolve_accelerator(opts: StrategyOptions, accelerator: Accelerator | None) -> Accelerator:
    """The accelerator instance, or the one ``opts.accelerator`` names (checked to be available here), with the
    reason of the choice for the start summary."""
    acc_name, accelerator = _name_or_instance(accelerator or opts.accelerator, Accelerator, "accelerator")
    reason = "given as an Accelerator instance"
    if accelerator is None:
        acc_name, reason = _accelerator_name(opts, acc_name)
        accelerator = ACCELERATORS.build(acc_name)
        _check_available(accelerator, acc_name)
    accelerator.selection_reason = reason  # for the start summary
    return accelerator


def _hf_strategy_name(opts: StrategyOptions, name: str) -> str:
    """The strategy name after HF's selectors: ``deepspeed=CONFIG`` selects DeepSpeed, ``fsdp="full_shard ..."``
    FSDP (from ``"auto"``).

    Raises:
        ValueError: either selector contradicting an explicit strategy name.
    """
    if opts.deepspeed:
        if name == "auto":
            name = "deepspeed"
        elif not name.startswith("deepspeed"):
            raise ValueError(f"deepspeed= (a DeepSpeed config) conflicts with strategy={name!r}; drop one of "
                             "them or use strategy='deepspeed'.")
    if opts.fsdp:
        if name == "auto":
            name = "fsdp"
        elif name not in ("fsdp", "fsdp2", "xla_fsdp"):
            raise ValueError(f"fsdp={opts.fsdp!r} conflicts with strategy={name!r}; drop one of them or use "
                             "strategy='fsdp'.")
    return name


def _build_strategy(opts: StrategyOptions, name: str, accelerator: Accelerator, devices: list[Any],
                    precision_plugin: Precision | None, ckpt_plugin: CheckpointIO | None,
                    extra: dict[str, Any]) -> Strategy:
    """Build the strategy registered as ``name`` with its precision plugin (parsed from the precision name once)
    and checkpoint IO; ``extra``: the deferred constructor options of an object form.

    Raises:
        ValueError: several devices under ``single_device``, a precision plugin of the wrong kind for the
            strategy, a precision the device kind lacks.
        NotImplementedError: a registered name whose component has not landed.
    """
    entry = STRATEGIES.get(name)
    if name == "auto" and len(devices) > 1:
        entry = STRATEGIES.get("ddp")  # several processes -> DDP
    if len(devices) > 1 and name == "single_device":
        raise ValueError(f"strategy={name!r} runs one process, but devices={opts.devices!r} asks for "
                         f"{len(devices)}; use strategy='ddp' or devices=1.")
    if entry.pending:
        entry.build()  # raises NotImplementedError naming the issue
    plugin_class = entry.factory.precision_plugin  # FSDP, DeepSpeed, XLA: their own
    if precision_plugin is None:
        pname, precision_plugin = _name_or_instance(opts.resolved_precision(), Precision, "precision")
        if precision_plugin is None:
            precision_plugin = build_precision(pname, plugin_class)  # the name is parsed here, once
    elif plugin_class is not None and not isinstance(precision_plugin, plugin_class):
        raise ValueError(f"strategy={name!r} needs a {plugin_class.__name__} precision plugin, got "
                         f"{type(precision_plugin).__name__}; pass precision= by name or a "
                         f"{plugin_class.__name__} instance.")
    accelerator.check_precision(precision_plugin)  # dtypes / loss scaling the device kind lacks
    if ckpt_plugin is None:
        cname, ckpt_plugin = _name_or_instance(opts.checkpoint_io or "auto", CheckpointIO, "checkpoint_io")
        if ckpt_plugin is None:
            ckpt_plugin = CHECKPOINT_IO.build(cname)
    if entry.factory.parallel:
        return entry.build(accelerator=accelerator, devices=devices, precision=precision_plugin,
                           checkpoint_io=ckpt_plugin, num_nodes=opts.num_nodes,
                           settings=strategy_settings(entry.factory, opts), **extra)
    return entry.build(accelerator=accelerator, device=devices[0], precision=precision_plugin,
                       checkpoint_io=ckpt_plugin)


def configure_strategy(strategy: Strategy, options: StrategyOptions | Any) -> None:
    """Resolve the settings ``strategy`` reads from the run's options and apply them
    (:meth:`Strategy.apply_settings`). ``Fit`` and ``Engine`` call it before each run (a hyperparameter-search
    trial or an ``auto_find_batch_size`` retry brings new options).

    Args:
        strategy (Strategy): a built strategy.
        options (StrategyOptions | FitArguments): the run's options.

    Raises:
        ValueError: options the strategy cannot run with (a DeepSpeed config conflicting with the arguments, bad
            FSDP options), each naming the option.
    """
    strategy.apply_settings(strategy_settings(strategy, options))


def strategy_settings(strategy: Strategy | type[Strategy], options: StrategyOptions | Any) -> StrategySettings:
    """The settings of ``strategy``'s family (its ``settings_type``) resolved from ``options`` (a
    ``StrategyOptions``, or ``FitArguments`` read through :meth:`StrategyOptions.from_arguments`). Given a
    class (the strategy is about to be built), the parts that need the built strategy (the FSDP options merged
    with its keyword arguments, the DeepSpeed config filled for its world size) are left for
    :func:`configure_strategy`.

    Raises:
        ValueError: see :func:`configure_strategy`.
    """
    kind, opts = strategy.settings_type, as_strategy_options(options)
    for settings_class in kind.__mro__:
        resolver = _RESOLVERS.get(settings_class)
        if resolver is not None:
            return resolver(strategy, opts)
    raise TypeError(f"No settings resolver for {kind.__name__} (strategy={strategy.name!r}).")


def _process_group(opts: StrategyOptions) -> dict[str, Any]:
    return dict(backend=opts.ddp_backend or None, timeout=opts.ddp_timeout)


def _ddp_settings(strategy: Any, opts: StrategyOptions) -> DDPSettings:
    static = opts.ddp_static_graph
    return DDPSettings(**_process_group(opts), find_unused_parameters=bool(opts.ddp_find_unused_parameters or False),
                       broadcast_buffers=opts.ddp_broadcast_buffers,
                       static_graph=None if static is None else bool(static), bucket_cap_mb=opts.ddp_bucket_cap_mb)


def _fsdp_settings(strategy: Any, opts: StrategyOptions) -> FSDPSettings:
    from taskfit.strategies.fsdp_options import resolve_fsdp_options

    options = None
    if isinstance(strategy, Strategy):  # the constructor's options win over the run's
        options = resolve_fsdp_options(opts.fsdp, opts.fsdp_config, legacy_min_num_params=opts.fsdp_min_num_params,
                                       legacy_layer_classes=opts.fsdp_transformer_layer_cls_to_wrap,
                                       gradient_checkpointing=opts.gradient_checkpointing,
                                       **strategy.option_overrides)
    return FSDPSettings(**_process_group(opts), options=options, save_on_each_node=bool(opts.save_on_each_node),
                        save_safetensors=opts.save_safetensors is not False)


def _deepspeed_settings(strategy: Any, opts: StrategyOptions) -> DeepSpeedSettings:
    from taskfit.optim.schedulers import get_warmup_steps
    from taskfit.strategies.deepspeed_config import resolve_config

    config: dict[str, Any] = {}
    if isinstance(strategy, Strategy):  # filled for the built strategy's world size and precision
        request = strategy.config_request
        raw = request.config if request.config is not None else opts.deepspeed
        config = resolve_config(raw, opts.schedule, world_size=strategy.world_size, precision=strategy.precision.name,
                                **request.preset())
    return DeepSpeedSettings(**_process_group(opts), config=config, weight_decay=opts.schedule.weight_decay,
                             warmup_steps=functools.partial(get_warmup_steps, opts.schedule),
                             make_scheduler=functools.partial(_run_scheduler, opts.schedule))


def _run_scheduler(schedule: ScheduleOptions, optimizer: Any, max_steps: int) -> Any:
    """The run's LR schedule over ``optimizer`` for ``max_steps`` steps (a module-level function: settings travel
    pickled into spawned workers)."""
    from taskfit.optim.schedulers import create_scheduler

    return create_scheduler(optimizer, schedule, max_steps)


def _xla_fsdp_settings(strategy: Any, opts: StrategyOptions) -> XLAFSDPSettings:
    from taskfit.strategies.fsdp_options import read_fsdp_config

    return XLAFSDPSettings(fsdp_config=read_fsdp_config(opts.fsdp_config), devices=opts.devices)


_RESOLVERS: dict[type, Callable[[Any, StrategyOptions], StrategySettings]] = {
    StrategySettings: lambda strategy, opts: StrategySettings(),
    ProcessGroupSettings: lambda strategy, opts: ProcessGroupSettings(**_process_group(opts)),
    DDPSettings: _ddp_settings,
    FSDPSettings: _fsdp_settings,
    DeepSpeedSettings: _deepspeed_settings,
    XLAFSDPSettings: _xla_fsdp_settings,
}


def _accelerator_name(opts: StrategyOptions, name: str) -> tuple[str, str]:
    """Apply ``use_cpu``/``no_cuda`` (force CPU) and the deprecated HF ``use_mps_device`` (means ``"mps"``), then
    resolve ``"auto"``/``"gpu"``/``"tpu"`` (F-ACC-1). Returns ``(registry name, reason)``.

    Raises:
        ValueError: ``use_cpu`` or ``use_mps_device`` contradicting ``accelerator``, or each other.
    """
    use_cpu, use_mps = opts.use_cpu, opts.use_mps_device
    if use_cpu and use_mps:
        raise ValueError("use_cpu=True conflicts with use_mps_device=True; drop one of them.")
    if use_cpu:
        if name not in ("auto", "cpu"):
            raise ValueError(f"use_cpu=True conflicts with accelerator={name!r}; drop one of them.")
        return "cpu", "use_cpu=True forces the CPU"
    if use_mps:
        if name not in ("auto", "mps", "gpu"):
            raise ValueError(f"use_mps_device=True (deprecated: use accelerator='mps') conflicts with "
                             f"accelerator={name!r}; drop one of them.")
        return "mps", "use_mps_device=True (deprecated alias of accelerator='mps')"
    return choose_accelerator(name)


def _check_available(accelerator: Accelerator, name: str) -> None:
    """Raise before any work when the chosen device kind cannot run here.

    Raises:
        ModuleNotFoundError: XLA without torch_xla (names the extra ``taskfit[xla]``).
        ValueError: CUDA/MPS/XLA not available here (names it and what is).
    """
    if accelerator.is_available():
        return
    if name in ("xla", "tpu"):
        from taskfit.accelerators.xla import require_torch_xla

        require_torch_xla(f"accelerator={name!r}")
        raise ValueError(f"accelerator={name!r}: no PJRT device is configured; set PJRT_DEVICE (TPU, CPU, CUDA "
                         "or NEURON) or run on a TPU host.")
    raise ValueError(f"accelerator={name!r} is not available on this machine ({type(accelerator).__name__}."
                     "is_available() is False); use accelerator='auto' or 'cpu'.")


def _devices_value(opts: StrategyOptions, accelerator: Accelerator) -> Any:
    """``devices``, or HF ``tpu_num_cores`` on XLA when ``devices`` is left at ``"auto"``.

    Raises:
        ValueError: ``tpu_num_cores`` with a non-XLA accelerator, or contradicting ``devices``.
    """
    cores = opts.tpu_num_cores
    if cores is None:
        return opts.devices
    if accelerator.name != "xla":
        raise ValueError(f"tpu_num_cores={cores!r} only applies to accelerator='xla'/'tpu', but the accelerator is "
                         f"{accelerator.name!r}; unset tpu_num_cores or use devices=.")
    if opts.devices not in ("auto", None, cores):
        raise ValueError(f"tpu_num_cores={cores!r} conflicts with devices={opts.devices!r}; drop one of them.")
    return cores


def _accelerator_strategy(accelerator: Accelerator, name: str, opts: StrategyOptions) -> str:
    """The strategy name after the device kind's rules: MPS refuses multi-process strategies; XLA runs under
    ``"xla"`` (``"auto"``) or ``"xla_fsdp"`` (HF ``fsdp`` with ``fsdp_config={"xla": True}``); the XLA strategies
    refuse other device kinds.

    Raises:
        ValueError: naming the strategy/accelerator pair that cannot work.
    """
    if accelerator.name == "mps":
        accelerator.check_strategy(name)
    if accelerator.name == "xla":
        if name in ("auto", "single_device"):
            return "xla"  # one replica or several: XLAStrategy (mark_step, CPU checkpoints)
        if name in ("fsdp", "fsdp2") and opts.fsdp:
            from taskfit.strategies.fsdp_options import read_fsdp_config

            if read_fsdp_config(opts.fsdp_config).get("xla"):
                return "xla_fsdp"
        if name not in ("xla", "xla_fsdp"):
            raise ValueError(f"strategy={name!r} does not run on XLA devices; use strategy='xla' (data parallel) "
                             "or 'xla_fsdp' with accelerator='xla'.")
    elif name in ("xla", "xla_fsdp"):
        from taskfit.accelerators.xla import require_torch_xla

        require_torch_xla(f"strategy={name!r}")
        raise ValueError(f"strategy={name!r} needs accelerator='xla' (or 'tpu'); the accelerator is "
                         f"{accelerator.name!r}.")
    return name
