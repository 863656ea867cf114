"""Resolves ``Fit``'s accelerator / strategy / devices / precision / plugins into concrete objects and checks
they fit together before any work starts (DESIGN.md "Registries")."""

from __future__ import annotations

from typing import Any

from taskfit.accelerators import ACCELERATORS, Accelerator
from taskfit.io import CHECKPOINT_IO, CheckpointIO
from taskfit.precision import PRECISIONS, Precision
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
    if accelerator is None:
        if args.use_cpu or getattr(args, "no_cuda", False):
            if acc_name not in ("auto", "cpu"):
                raise ValueError(f"use_cpu=True conflicts with accelerator={acc_name!r}; drop one of them.")
            acc_name = "cpu"
        if acc_name == "auto":
            acc_name = "cpu"  # CUDA/MPS/XLA auto-selection lands with the accelerators issue (#6)
        accelerator = ACCELERATORS.build(acc_name)
    devices = accelerator.parse_devices(args.devices)

    # strategy
    strat_name, strategy = _name_or_instance(strategy or args.strategy, Strategy, "strategy")
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
        elif strat_name not in ("fsdp", "fsdp2"):
            raise ValueError(f"fsdp={args.fsdp!r} conflicts with strategy={strat_name!r}; drop one of them or use "
                             "strategy='fsdp'.")
    if strategy is None:
        entry = STRATEGIES.get(strat_name)
        if strat_name == "auto" and len(devices) > 1:
            entry = STRATEGIES.get("ddp")  # several processes -> DDP
        if len(devices) > 1 and strat_name == "single_device":
            raise ValueError(f"strategy={strat_name!r} runs one process, but devices={args.devices!r} asks for "
                             f"{len(devices)}; use strategy='ddp' or devices=1.")
        if entry.pending:
            entry.build()  # raises NotImplementedError naming the issue
        if precision_plugin is None:
            pname, precision_plugin = _name_or_instance(args.resolved_precision(), Precision, "precision")
            if precision_plugin is None:
                precision_plugin = PRECISIONS.build(pname)
        if ckpt_plugin is None:
            cname, ckpt_plugin = _name_or_instance(getattr(args, "checkpoint_io", "auto") or "auto", CheckpointIO,
                                                   "checkpoint_io")
            if ckpt_plugin is None:
                ckpt_plugin = CHECKPOINT_IO.build(cname)
        if getattr(entry.factory, "parallel", False):
            strategy = entry.build(accelerator=accelerator, devices=devices, precision=precision_plugin,
                                   checkpoint_io=ckpt_plugin, num_nodes=args.num_nodes, args=args)
        else:
            strategy = entry.build(accelerator=accelerator, device=devices[0], precision=precision_plugin,
                                   checkpoint_io=ckpt_plugin)
    strategy.precision.setup_device(strategy.root_device)  # e.g. 16-mixed: the GradScaler, or a clear error
    return strategy
