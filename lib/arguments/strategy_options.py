"""The options the connector turns into a strategy, as two small frozen objects: :class:`StrategyOptions` (which
accelerator, strategy, devices, precision, and the settings each strategy family reads) and
:class:`ScheduleOptions` (the batch, optimizer and LR-schedule values a DeepSpeed config's ``"auto"`` entries and
a DeepSpeed-built optimizer or schedule take). ``Fit`` builds them from its ``FitArguments``
(:meth:`StrategyOptions.from_arguments`); ``Engine`` from its own keyword arguments (:meth:`StrategyOptions.
from_values`), without a whole ``FitArguments``. Field names, types and defaults are those of ``FitArguments``
(HF ``TrainingArguments``), so an option means the same under both. Mirrors how Lightning's connector takes the
Trainer's placement arguments rather than the Trainer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from taskfit.arguments.fields import DEFAULT_OPTIM


@dataclass(frozen=True)
class ScheduleOptions:
    """The batch, optimizer and LR-schedule values DeepSpeed fills its ``"auto"`` config entries from and builds
    its optimizer and schedule with (HF ``TrainingArguments`` names and defaults).

    Attributes:
        per_device_train_batch_size (int): samples per process per micro-batch.
        gradient_accumulation_steps (int): micro-batches per optimizer step.
        max_grad_norm (float): gradient-norm clipping bound; 0 disables clipping.
        optim (str): optimizer name (``"adamw_torch"``, ``"adamw_torch_fused"``, ``"adagrad"``, ``"lion"``...).
        learning_rate (float): peak learning rate.
        weight_decay (float): decoupled weight decay.
        adam_beta1, adam_beta2, adam_epsilon (float): Adam(W) hyperparameters.
        lr_scheduler_type (str): schedule name (``"linear"``, ``"cosine"``, ``"constant"``...).
        lr_scheduler_kwargs (dict): extra keyword arguments of the schedule (a JSON object string is decoded).
        warmup_steps (float): warmup optimizer steps (>= 1) or a ratio of the run's steps (< 1).
        warmup_ratio (float): warmup as a ratio of the run's steps (HF 4 spelling; used when ``warmup_steps`` is 0).
    """

    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    optim: str = DEFAULT_OPTIM
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict | str | None = field(default_factory=dict)
    warmup_steps: float = 0
    warmup_ratio: float = 0.0


@dataclass(frozen=True)
class StrategyOptions:
    """What the connector (:func:`taskfit.connector.resolve_components`) builds and configures a strategy from:
    component names and the settings the strategy families read (HF ``TrainingArguments`` names and defaults).

    Attributes:
        accelerator (str): ``"auto"``, ``"cpu"``, ``"cuda"``/``"gpu"``, ``"mps"``, ``"xla"``/``"tpu"``.
        strategy (str): a registered strategy name (``"auto"``, ``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``...).
        devices (int | str | list[int]): ``"auto"``, -1 (all), a count or device indices (on the CPU: processes).
        num_nodes (int): machines.
        precision (str | None): the precision plugin's name (``"bf16-mixed"``...; HF's ``bf16``/``fp16`` flags
            already folded in); None: not chosen (``"32-true"``).
        checkpoint_io (str): checkpoint IO name (``"auto"``, ``"torch"``, ``"async"``...).
        use_cpu (bool): force the CPU (HF ``use_cpu``; the 4.x ``no_cuda`` folded in).
        use_mps_device (bool): the deprecated HF alias of ``accelerator="mps"``.
        tpu_num_cores (int | None): HF's XLA process count when ``devices`` is ``"auto"``.
        deepspeed (dict | str | None): a DeepSpeed config (dict, JSON string or file path); selects DeepSpeed.
        fsdp (list[str]): HF ``fsdp`` words (``["full_shard", "auto_wrap"]``); non-empty selects FSDP.
        fsdp_config (dict | str | None): HF ``fsdp_config`` (dict, JSON string or file path).
        fsdp_min_num_params (int): legacy size-based auto-wrap threshold (parameters).
        fsdp_transformer_layer_cls_to_wrap (str | None): legacy layer-class auto-wrap.
        gradient_checkpointing (bool | None): activation checkpointing through FSDP's options.
        ddp_backend (str | None): process-group backend (``"gloo"``, ``"nccl"``...); None: by device kind.
        ddp_timeout (int | None): collective timeout in seconds; None: 1800.
        ddp_find_unused_parameters, ddp_broadcast_buffers, ddp_static_graph (bool | None): DDP keywords.
        ddp_bucket_cap_mb (int | None): DDP bucket size in MiB; None: DDP's default.
        save_on_each_node (bool): every node's local rank 0 writes full-weight files.
        save_safetensors (bool | None): full weights as ``model.safetensors`` (True) or ``pytorch_model.bin``.
        schedule (ScheduleOptions): the DeepSpeed ``"auto"`` inputs.
    """

    accelerator: str = "auto"
    strategy: str = "auto"
    devices: int | str | list[int] = "auto"
    num_nodes: int = 1
    precision: str | None = None
    checkpoint_io: str = "auto"
    use_cpu: bool = False
    use_mps_device: bool = False
    tpu_num_cores: int | None = None
    deepspeed: dict | str | None = None
    fsdp: str | list[str] | None = field(default_factory=list)
    fsdp_config: dict | str | None = None
    fsdp_min_num_params: int = 0
    fsdp_transformer_layer_cls_to_wrap: str | None = None
    gradient_checkpointing: bool | None = False
    ddp_backend: str | None = None
    ddp_timeout: int | None = 1800
    ddp_find_unused_parameters: bool | None = None
    ddp_broadcast_buffers: bool | None = None
    ddp_static_graph: bool | None = None
    ddp_bucket_cap_mb: int | None = None
    save_on_each_node: bool = False
    save_safetensors: bool | None = True
    schedule: ScheduleOptions = field(default_factory=ScheduleOptions)

    def resolved_precision(self) -> str:
        """The precision plugin's name: :attr:`precision`, else ``"32-true"``."""
        return self.precision or "32-true"

    @classmethod
    def option_names(cls) -> list[str]:
        """Every option name, flat (the :class:`ScheduleOptions` names included), in declaration order."""
        return [f.name for f in fields(cls) if f.name != "schedule"] + [f.name for f in fields(ScheduleOptions)]

    @classmethod
    def from_arguments(cls, args: Any) -> StrategyOptions:
        """The options of a validated ``FitArguments`` (``bf16``/``fp16`` folded into :attr:`precision`,
        ``no_cuda`` into :attr:`use_cpu`). Values are taken as they are (no copy, no second validation).

        Args:
            args (FitArguments): the run's arguments.
        """
        chosen = args.precision is not None or args.bf16 or args.fp16
        own = {f.name: getattr(args, f.name) for f in fields(cls) if f.name not in ("schedule", "precision", "use_cpu",
                                                                                 "use_mps_device")}
        return cls(**own, precision=args.resolved_precision() if chosen else None,
                   use_cpu=bool(args.use_cpu or getattr(args, "no_cuda", False)),
                   use_mps_device=bool(getattr(args, "use_mps_device", False)),
                   schedule=ScheduleOptions(**{f.name: getattr(args, f.name) for f in fields(ScheduleOptions)}))

    @classmethod
    def from_values(cls, **values: Any) -> StrategyOptions:
        """Options from keyword values (flat: :class:`ScheduleOptions` names included), each normalised and
        checked by the rules ``FitArguments`` applies to it (types, choices, ranges, ``fsdp`` words, ``devices``,
        JSON object strings, Lightning's precision aliases); the others keep their defaults.

        Raises:
            ValueError: a bad value (naming it and the valid choices), or a name that is not an option here.
        """
        from taskfit.arguments.validation import check_values

        names = {f.name for f in fields(ScheduleOptions)}
        schedule = check_values(ScheduleOptions, {k: v for k, v in values.items() if k in names})
        own = check_values(cls, {k: v for k, v in values.items() if k not in names})
        return cls(**own, schedule=ScheduleOptions(**schedule))

    def to_dict(self, redact: bool = True) -> dict[str, Any]:
        """Every option, flat (see :meth:`option_names`), as a plain dict (deep copy); ``redact`` replaces
        credentials inside config dicts (see :func:`taskfit.redact.redact_value`)."""
        import copy

        from taskfit.redact import redact_value

        flat = {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "schedule"},
                **dataclasses.asdict(self.schedule)}
        return {k: redact_value(k, v) if redact else copy.deepcopy(v) for k, v in flat.items()}


def as_strategy_options(options: Any) -> StrategyOptions:
    """``options`` itself when it is a :class:`StrategyOptions`, else the options of the ``FitArguments``
    ``options`` (:meth:`StrategyOptions.from_arguments`)."""
    return options if isinstance(options, StrategyOptions) else StrategyOptions.from_arguments(options)


__all__ = ["ScheduleOptions", "StrategyOptions", "as_strategy_options"]
