"""Resolves ``Fit``'s accelerator / strategy / devices / precision / plugins into concrete objects and checks
they fit together before any work starts (DESIGN.md "Registries")."""

from __future__ import annotations

from typing import Any

from taskfit.accelerators import ACCELERATORS, Accelerator, choose_accelerator
from taskfit.io import CHECKPOINT_IO, CheckpointIO
from taskfit.precision import Precision, build_precision
from taskfit.strategies import STRATEGIES, Strategy


def _name_or_instance(value: Any, kind: type, what: str) -> tuple[str | None, Any]:
    if isinstance(value, kind):
        return None, value
    if isinstance(value, str):
        return value.strip().lower() if what != "precision" else value.strip(), None
    raise TypeError(f"{what} must be a name or a {kind.__name__} instance; got {type(value).__name__}.")


def resolve_components(args: Any, plugins: list[Any] | None = None, accelerator: Accelerator | None = None,
                       strategy: Strategy | None = None) -> Strategy:
    """Build the strategy (which owns accelerator, precision and checkpoint IO) for ``args``.

    ``args.accelerator``/``strategy``/``precision`` are registry names; ``accelerator``/``strategy`` instances
    override them, and ``plugins`` may hold a ``Precision`` or ``CheckpointIO`` instance. Mirrors Lightning's ``_AcceleratorConnector``.

    Raises:
        ValueError: an unknown name (with the valid choices and the closest match), a conflicting pair, or
            ``devices`` asking for more than one process under a single-device strategy.
        NotImplementedError: a known name whose component has not landed yet (names the issue).
        TypeError: a plugin of an unknown kind.
    """
    from taskfit.data.loaders import data_options

    data_options(args)  # accelerator_config / split_batches: bad keys fail before any work
    precision_plugin, ckpt_plugin = None, None
    for p in plugins or []:
        if isinstance(p, Precision):
            precision_plugin = p
        elif isinstance(p, CheckpointIO):
            ckpt_plugin = p
        else:
            raise TypeError(f"Unsupported plugin {type(p).__name__}: pass Precision or CheckpointIO instances.")

    # accelerator
    acc_name, accelerator = _name_or_instance(accelerator or args.accelerator, Accelerator, "accelerator")
    reason = "given as an Accelerator instance"
    if accelerator is None:
        acc_name, reason = _accelerator_name(args, acc_name)
        accelerator = ACCELERATORS.build(acc_name)
        _check_available(accelerator, acc_name)
    accelerator.selection_reason = reason  # for the start summary
    devices = accelerator.parse_devices(_devices_value(args, accelerator))

    # strategy
    strat_name, strategy = _name_or_instance(strategy or args.strategy, Strategy, "strategy")
    extra: dict[str, Any] = {}
    if strategy is not None and getattr(strategy, "deferred", None) is not None:
        # an object given only its own options (``ModelParallelStrategy(data_parallel_size=2, ...)``, as in
        # Lightning): built here from them like the named strategy, with Fit's accelerator, devices and precision
        strat_name, extra, strategy = strategy.name, dict(strategy.deferred), None
    if strategy is not None and (precision_plugin is not None or ckpt_plugin is not None
                                 or args.precision is not None or args.bf16 or args.fp16):
        raise ValueError("A Strategy instance owns its precision and checkpoint IO: give them to the strategy, "
                         "not as precision=/plugins= (or pass the strategy by name).")
    if strategy is None and getattr(args, "deepspeed", None):  # HF deepspeed=CONFIG selects the DeepSpeed strategy
        if strat_name == "auto":
            strat_name = "deepspeed"
        elif not strat_name.startswith("deepspeed"):
            raise ValueError(f"deepspeed= (a DeepSpeed config) conflicts with strategy={strat_name!r}; drop one of "
                             "them or use strategy='deepspeed'.")
    if strategy is None and getattr(args, "fsdp", None):  # HF fsdp="full_shard ..." selects the FSDP strategy
        if strat_name == "auto":
            strat_name = "fsdp"
        elif strat_name not in ("fsdp", "fsdp2", "xla_fsdp"):
            raise ValueError(f"fsdp={args.fsdp!r} conflicts with strategy={strat_name!r}; drop one of them or use "
                             "strategy='fsdp'.")
    if strategy is None:
        strat_name = _accelerator_strategy(accelerator, strat_name, args)
        entry = STRATEGIES.get(strat_name)
        if strat_name == "auto" and len(devices) > 1:
            entry = STRATEGIES.get("ddp")  # several processes -> DDP
        if len(devices) > 1 and strat_name == "single_device":
            raise ValueError(f"strategy={strat_name!r} runs one process, but devices={args.devices!r} asks for "
                             f"{len(devices)}; use strategy='ddp' or devices=1.")
        if entry.pending:
            entry.build()  # raises NotImplementedError naming the issue
        plugin_class = getattr(entry.factory, "precision_plugin", None)  # FSDP, DeepSpeed, XLA: their own
        if precision_plugin is None:
            pname, precision_plugin = _name_or_instance(args.resolved_precision(), Precision, "precision")
            if precision_plugin is None:
                precision_plugin = build_precision(pname, plugin_class)  # the name is parsed here, once
        elif plugin_class is not None and not isinstance(precision_plugin, plugin_class):
            raise ValueError(f"strategy={strat_name!r} needs a {plugin_class.__name__} precision plugin, got "
                             f"{type(precision_plugin).__name__}; pass precision= by name or a "
                             f"{plugin_class.__name__} instance.")
        accelerator.check_precision(precision_plugin)  # dtypes / loss scaling the device kind lacks
        if ckpt_plugin is None:
            cname, ckpt_plugin = _name_or_instance(getattr(args, "checkpoint_io", "auto") or "auto", CheckpointIO,
                                                   "checkpoint_io")
            if ckpt_plugin is None:
                ckpt_plugin = CHECKPOINT_IO.build(cname)
        if getattr(entry.factory, "parallel", False):
            strategy = entry.build(accelerator=accelerator, devices=devices, precision=precision_plugin,
                                   checkpoint_io=ckpt_plugin, num_nodes=args.num_nodes, args=args, **extra)
        else:
            strategy = entry.build(accelerator=accelerator, device=devices[0], precision=precision_plugin,
                                   checkpoint_io=ckpt_plugin)
    strategy.precision.setup_device(strategy.root_device)  # e.g. 16-mixed: the GradScaler, or a clear error
    return strategy


def _accelerator_name(args: Any, name: str) -> tuple[str, str]:
    """Apply ``use_cpu``/``no_cuda`` (force CPU) and the deprecated HF ``use_mps_device`` (means ``"mps"``), then
    resolve ``"auto"``/``"gpu"``/``"tpu"`` (F-ACC-1). Returns ``(registry name, reason)``.

    Raises:
        ValueError: ``use_cpu`` or ``use_mps_device`` contradicting ``accelerator``, or each other.
    """
    use_cpu, use_mps = args.use_cpu or getattr(args, "no_cuda", False), getattr(args, "use_mps_device", False)
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


def _devices_value(args: Any, accelerator: Accelerator) -> Any:
    """``devices``, or HF ``tpu_num_cores`` on XLA when ``devices`` is left at ``"auto"``.

    Raises:
        ValueError: ``tpu_num_cores`` with a non-XLA accelerator, or contradicting ``devices``.
    """
    cores = getattr(args, "tpu_num_cores", None)
    if cores is None:
        return args.devices
    if accelerator.name != "xla":
        raise ValueError(f"tpu_num_cores={cores!r} only applies to accelerator='xla'/'tpu', but the accelerator is "
                         f"{accelerator.name!r}; unset tpu_num_cores or use devices=.")
    if args.devices not in ("auto", None, cores):
        raise ValueError(f"tpu_num_cores={cores!r} conflicts with devices={args.devices!r}; drop one of them.")
    return cores


def _accelerator_strategy(accelerator: Accelerator, name: str, args: Any) -> str:
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
        if name in ("fsdp", "fsdp2") and getattr(args, "fsdp", None):
            from taskfit.strategies.fsdp_options import read_fsdp_config

            if read_fsdp_config(getattr(args, "fsdp_config", None)).get("xla"):
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
