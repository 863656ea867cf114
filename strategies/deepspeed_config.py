"""The DeepSpeed config of a run (F-STRAT-6, F-PREC-3): read a dict / JSON string / JSON file (HF ``deepspeed=``),
apply a registry preset (``deepspeed_stage_3_offload`` ...), fill ``"auto"`` values from the run's options and
report every real conflict in one error. Mirrors HF ``HfTrainerDeepSpeedConfig.trainer_config_process`` /
``trainer_config_finalize``. Imports neither torch nor deepspeed.

Mapping (config key <- argument):

====================================  ==============================================================
``train_micro_batch_size_per_gpu``    ``per_device_train_batch_size``
``gradient_accumulation_steps``       ``gradient_accumulation_steps``
``train_batch_size``                  micro batch x accumulation x world size
``gradient_clipping``                 ``max_grad_norm`` (0 or None: 0.0, no clipping; DeepSpeed 0.19
                                      would default to 1.0)
``bf16.enabled`` / ``fp16.enabled``   the precision: ``bf16-mixed``/``bf16-true`` / ``16-mixed``/``16-true``
``optimizer.type``                    ``optim``: ``adamw_*`` -> ``AdamW``, ``adagrad`` -> ``Adagrad``, ``lion`` -> ``Lion``
``optimizer.params``                  ``lr`` <- ``learning_rate``, ``betas`` <- (``adam_beta1``, ``adam_beta2``),
                                      ``eps`` <- ``adam_epsilon``, ``weight_decay`` <- ``weight_decay``
``scheduler.type``                    ``lr_scheduler_type``: ``linear`` -> ``WarmupDecayLR``, ``cosine`` ->
                                      ``WarmupCosineLR``, ``constant``/``constant_with_warmup`` -> ``WarmupLR``
``scheduler.params``                  warmup steps (``warmup_steps``/``warmup_ratio``), ``learning_rate``, max steps
====================================  ==============================================================
"""

from __future__ import annotations

import copy
from typing import Any

from taskfit.precision.deepspeed import DS_PRECISIONS  # noqa: F401  (re-exported: the config's precision names)
from taskfit.redact import shown  # config values in messages: no credential shown

AUTO = "auto"
#: ``optim`` -> DeepSpeed optimizer type (``optimizer.type``); others stay taskfit optimizers handed to the engine
OPTIM_TO_DS = {"adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "adamw_hf": "AdamW", "adagrad": "Adagrad",
               "lion": "Lion"}
#: ``lr_scheduler_type`` -> DeepSpeed scheduler type
SCHED_TO_DS = {"linear": "WarmupDecayLR", "cosine": "WarmupCosineLR", "constant": "WarmupLR",
               "constant_with_warmup": "WarmupLR"}
OFFLOAD_DEVICES = ("cpu", "nvme")


def load_config(config: Any) -> dict[str, Any]:
    """A deep copy of ``config``: a dict, a JSON object string (``'{...}'``) or the path of a JSON file.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: text that is not a JSON object.
        TypeError: any other type.
    """
    from taskfit.json_options import load_json_object

    return load_json_object(config, "DeepSpeed config")


def _offload(device: str, nvme_path: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "pin_memory": False}
    if device == "nvme":
        out["nvme_path"] = nvme_path
    return out


class ConfigFiller:
    """Fills ``"auto"`` values of ``config`` from ``args`` and collects conflicts (a config value that differs from
    the argument it mirrors); :meth:`raise_conflicts` raises them all in one ``ValueError``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config, self.conflicts = config, []

    def fill(self, section: dict[str, Any], key: str, value: Any, arg: str, dotted: str | None = None,
             default_missing: bool = True) -> None:
        """``section[key]``: ``"auto"`` (or missing, with ``default_missing``) becomes ``value``; a different
        explicit value is a conflict with argument ``arg`` (``arg=None``: no conflict check)."""
        if key not in section:
            if default_missing:
                section[key] = value
            return
        have = section[key]
        if have == AUTO:
            section[key] = value
        elif arg is not None and not _same(have, value):
            self.conflicts.append(f"{dotted or key}={have!r} but {arg}={value!r}")

    def raise_conflicts(self) -> None:
        """Raises:
            ValueError: every conflict found, one per line, and how to resolve them."""
        if self.conflicts:
            lines = "\n".join(f"  - {c}" for c in self.conflicts)
            raise ValueError(f"The DeepSpeed config conflicts with the arguments in {len(self.conflicts)} place(s):\n"
                             f"{lines}\nSet these config values to \"auto\" (taskfit fills them from the arguments) or "
                             "change the arguments to match.")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(b)))
    return a == b


def resolve_config(config: Any, args: Any, *, world_size: int, precision: str, stage: int | None = None,
                   offload_optimizer: str | None = None, offload_parameters: str | None = None,
                   nvme_path: str | None = None, on_cpu: bool = True) -> dict[str, Any]:
    """The DeepSpeed config for a run, everything but the step counts (see :func:`finalize_config`).

    Args:
        config (dict | str | None): the user's config (dict, JSON string or JSON file path); None for the preset.
        args (ScheduleOptions | FitArguments): batch size, accumulation, ``max_grad_norm``, ``optim`` and its
            hyperparameters, ``lr_scheduler_type`` (the connector passes the run's ``ScheduleOptions``).
        world_size (int): processes (data-parallel ranks) of the run.
        precision (str): the precision plugin's name (``"32-true"``, ``"bf16-mixed"``, ...).
        stage (int | None): ZeRO stage of the registry preset (None: the config's, else 2).
        offload_optimizer (str | None): ``"cpu"``/``"nvme"``: optimizer state offload of the preset.
        offload_parameters (str | None): ``"cpu"``/``"nvme"``: parameter offload (ZeRO-3) of the preset.
        nvme_path (str | None): folder for NVMe offload.
        on_cpu (bool): the run uses DeepSpeed's CPU accelerator (fp16 is refused; plain torch Adam/AdamW are
            used instead of the JIT-compiled fused ones).

    Returns:
        dict: the resolved config (``"auto"`` values filled, except the scheduler's step counts).

    Raises:
        ValueError: conflicts between config and arguments (all of them in one message), a precision DeepSpeed
            cannot run here (fp16 on CPU, ``64-true``), an invalid stage or offload device.
    """
    cfg = load_config(config)
    filler = ConfigFiller(cfg)
    half = _half_precision(cfg, precision, on_cpu)
    zero = _zero_section(cfg, filler, stage, offload_optimizer, offload_parameters, nvme_path)
    _fill_batch_and_precision(cfg, filler, args, world_size, precision, half)
    _optimizer_section(cfg, filler, args, zero, on_cpu)
    _scheduler_section(cfg, filler, args)
    filler.raise_conflicts()

    cfg.setdefault("steps_per_print", 2 ** 31 - 1)  # taskfit logs; keep DeepSpeed quiet
    cfg.setdefault("wall_clock_breakdown", False)
    if "optimizer" not in cfg:
        cfg.setdefault("zero_allow_untested_optimizer", True)  # the taskfit optimizer is handed to the engine
    return cfg


def _half_precision(cfg: dict[str, Any], precision: str, on_cpu: bool) -> str | None:
    """The config section (``"bf16"``/``"fp16"``/None) the precision plugin's name enables.

    Raises:
        ValueError: a precision DeepSpeed does not support, or fp16 (by name or in the config) on the CPU.
    """
    if precision not in DS_PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported by DeepSpeed; choose one of "
                         f"{sorted(DS_PRECISIONS)}.")
    half = DS_PRECISIONS[precision]
    if half == "fp16" and on_cpu:
        raise ValueError(f"precision={precision!r} (fp16) is not supported by DeepSpeed on the CPU accelerator "
                         "(DeepSpeed: 'Type fp16 is not supported on your device'); use precision='bf16-mixed' "
                         "(bf16=True) or '32-true'.")
    if isinstance(cfg.get("fp16"), dict) and cfg["fp16"].get("enabled") is True and on_cpu:
        raise ValueError("The DeepSpeed config enables fp16, which DeepSpeed refuses on the CPU accelerator; "
                         "enable bf16 instead or set fp16.enabled to \"auto\".")
    return half


def _zero_section(cfg: dict[str, Any], filler: ConfigFiller, stage: int | None, offload_optimizer: str | None,
                  offload_parameters: str | None, nvme_path: str | None) -> dict[str, Any]:
    """``zero_optimization`` with the preset's stage and offload devices applied; returns it.

    Raises:
        ValueError: a section that is not an object, an invalid stage or offload device, parameter offload below
            stage 3.
    """
    zero = cfg.setdefault("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ValueError(f"zero_optimization must be an object; got {shown('zero_optimization', zero)}.")
    if stage is not None:
        filler.fill(zero, "stage", stage, "strategy stage", "zero_optimization.stage")
    zero.setdefault("stage", 2)
    if zero["stage"] not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage={zero['stage']!r} is not valid; choose 0, 1, 2 or 3.")
    for key, device in (("offload_optimizer", offload_optimizer), ("offload_param", offload_parameters)):
        if device is None:
            continue
        if device not in OFFLOAD_DEVICES:
            raise ValueError(f"{key} device {device!r} is not valid; choose one of {list(OFFLOAD_DEVICES)}.")
        have = zero.get(key)
        if isinstance(have, dict) and have.get("device") not in (None, AUTO, device):
            filler.conflicts.append(f"zero_optimization.{key}.device={have['device']!r} but the strategy offloads "
                                    f"to {device!r}")
        else:
            zero[key] = {**_offload(device, nvme_path), **(have if isinstance(have, dict) else {})}
            zero[key]["device"] = device
    if zero.get("offload_param") and zero["stage"] != 3:
        raise ValueError(f"Parameter offload (zero_optimization.offload_param) needs ZeRO stage 3; the config has "
                         f"stage {zero['stage']}.")
    return zero


def _fill_batch_and_precision(cfg: dict[str, Any], filler: ConfigFiller, a: Any, world_size: int, precision: str,
                              half: str | None) -> None:
    """Batch sizes, accumulation, clipping and the ``bf16``/``fp16`` sections from the arguments.

    Raises:
        ValueError: a ``bf16``/``fp16`` section that is not an object.
    """
    micro, accum = int(a.per_device_train_batch_size), int(a.gradient_accumulation_steps)
    filler.fill(cfg, "train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size")
    filler.fill(cfg, "gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    filler.fill(cfg, "train_batch_size", micro * accum * world_size,
                f"per_device_train_batch_size x gradient_accumulation_steps x world_size ({micro}x{accum}x{world_size})")
    clip = float(a.max_grad_norm) if a.max_grad_norm and a.max_grad_norm > 0 else 0.0
    filler.fill(cfg, "gradient_clipping", clip, "max_grad_norm")
    for name in ("bf16", "fp16"):
        section = cfg.setdefault(name, {})
        if not isinstance(section, dict):
            raise ValueError(f"DeepSpeed config section {name!r} must be an object; got {shown(name, section)}.")
        filler.fill(section, "enabled", half == name, f"precision={precision!r}, so {name}", f"{name}.enabled")
    if cfg.get("bf16", {}).get("enabled") and cfg.get("fp16", {}).get("enabled"):
        filler.conflicts.append("bf16.enabled and fp16.enabled are both true")


def _optimizer_section(cfg: dict[str, Any], filler: ConfigFiller, a: Any, zero: dict[str, Any],
                       on_cpu: bool) -> None:
    """The ``optimizer`` section (added for optimizer offload): its type from ``optim``, its hyperparameters from
    the arguments.

    Raises:
        ValueError: a section that is not an object, or offload / ``type="auto"`` with an ``optim`` DeepSpeed has
            no optimizer for.
    """
    opt = cfg.get("optimizer")
    ds_optim = OPTIM_TO_DS.get(a.optim)
    if opt is None and (zero.get("offload_optimizer") or {}).get("device") in OFFLOAD_DEVICES:
        if ds_optim is None:
            raise ValueError(f"ZeRO optimizer offload needs a DeepSpeed optimizer, but optim={a.optim!r} has none; "
                             f"choose one of {sorted(OPTIM_TO_DS)} or add an 'optimizer' section to the config.")
        opt = cfg["optimizer"] = {"type": AUTO, "params": {}}
    if opt is None:
        return
    if not isinstance(opt, dict):
        raise ValueError(f"DeepSpeed config 'optimizer' must be an object; got {shown('optimizer', opt)}.")
    if opt.get("type", AUTO) == AUTO:
        if ds_optim is None:
            raise ValueError(f"optimizer.type='auto' but optim={a.optim!r} has no DeepSpeed optimizer; choose "
                             f"one of {sorted(OPTIM_TO_DS)} or name the type in the config.")
        opt["type"] = ds_optim
    elif ds_optim is not None and str(opt["type"]).lower() != ds_optim.lower() and a.optim != "adamw_torch":
        filler.conflicts.append(f"optimizer.type={opt['type']!r} but optim={a.optim!r}")
    params = opt.setdefault("params", {})
    filler.fill(params, "lr", a.learning_rate, "learning_rate", "optimizer.params.lr")
    filler.fill(params, "weight_decay", a.weight_decay, "weight_decay", "optimizer.params.weight_decay")
    kind = str(opt["type"]).lower()
    if kind in ("adam", "adamw", "lion"):
        filler.fill(params, "betas", [a.adam_beta1, a.adam_beta2], "(adam_beta1, adam_beta2)",
                    "optimizer.params.betas")
    if kind in ("adam", "adamw", "adagrad"):
        filler.fill(params, "eps", a.adam_epsilon, "adam_epsilon", "optimizer.params.eps")
    offloading = (zero.get("offload_optimizer") or {}).get("device") in OFFLOAD_DEVICES
    if on_cpu and not offloading and kind in ("adam", "adamw"):
        params.setdefault("torch_adam", True)  # torch's Adam(W): no JIT build of the fused op on CPU


def _scheduler_section(cfg: dict[str, Any], filler: ConfigFiller, a: Any) -> None:
    """The ``scheduler`` section, when present: its type from ``lr_scheduler_type``, peak and floor values.

    Raises:
        ValueError: a section that is not an object, or ``type="auto"`` with a schedule DeepSpeed lacks.
    """
    sched = cfg.get("scheduler")
    if sched is None:
        return
    if not isinstance(sched, dict):
        raise ValueError(f"DeepSpeed config 'scheduler' must be an object; got {shown('scheduler', sched)}.")
    if sched.get("type", AUTO) == AUTO:
        if a.lr_scheduler_type not in SCHED_TO_DS:
            raise ValueError(f"scheduler.type='auto' but lr_scheduler_type={a.lr_scheduler_type!r} has no "
                             f"DeepSpeed schedule; choose one of {sorted(SCHED_TO_DS)} or name the type.")
        sched["type"] = SCHED_TO_DS[a.lr_scheduler_type]
    params = sched.setdefault("params", {})
    filler.fill(params, "warmup_max_lr", a.learning_rate, "learning_rate", "scheduler.params.warmup_max_lr",
                default_missing=sched["type"] in ("WarmupLR", "WarmupDecayLR"))
    if sched["type"] in ("WarmupLR", "WarmupDecayLR"):
        filler.fill(params, "warmup_min_lr", 0.0, None)
        params.setdefault("warmup_type", "linear")  # HF's schedules warm up linearly (DeepSpeed: log)
    if sched["type"] == "WarmupCosineLR":
        filler.fill(params, "warmup_min_ratio", 0.0, None)
        filler.fill(params, "cos_min_ratio", 0.0, None)
        params.setdefault("warmup_type", "linear")


def finalize_config(cfg: dict[str, Any], args: Any, max_steps: int, warmup_steps: int) -> dict[str, Any]:
    """Fill the scheduler's step counts (``warmup_num_steps``, ``total_num_steps``) for a run of ``max_steps``
    optimizer steps with ``warmup_steps`` warmup steps; returns a copy.

    Raises:
        ValueError: explicit step counts that differ from the run's (one error for all).
    """
    cfg = copy.deepcopy(cfg)
    sched = cfg.get("scheduler")
    if sched is not None:
        filler = ConfigFiller(cfg)
        params = sched.setdefault("params", {})
        filler.fill(params, "warmup_num_steps", warmup_steps, "warmup steps", "scheduler.params.warmup_num_steps")
        if sched["type"] in ("WarmupDecayLR", "WarmupCosineLR"):
            filler.fill(params, "total_num_steps", max_steps, "max_steps", "scheduler.params.total_num_steps")
        filler.raise_conflicts()
    return cfg
