"""The normalisation and validation `FitArguments` runs on every construction (:func:`normalize_and_validate`),
and the option tables re-exported from ``taskfit.arguments.choices``.
"""

import json
import math
import os
import types
import typing
from dataclasses import fields
from collections.abc import Callable
from functools import cache
from typing import Any

from taskfit.registry import invalid_choice

from taskfit.redact import shown
from taskfit.arguments.choices import (  # noqa: F401  (the tables are re-exported here)
    INTERVAL_STRATEGIES, SAVE_STRATEGIES, HUB_STRATEGIES, PRECISIONS, PRECISION_ALIASES, LOG_LEVELS, REPORT_TO, BUILT_LOGGERS, installed_loggers, kubeflow_available, transformers_installed, FSDP_OPTIONS, DEBUG_OPTIONS, HALF_PRECISION_BACKENDS, DDP_BACKENDS, TRAIN_SAMPLING_STRATEGIES, INCLUDE_FOR_METRICS, TOKENS_SEEN, MULTIPROCESSING_CONTEXTS, LR_SCHEDULERS, OPTIMIZERS,
)


# --------------------------------------------------------------------------------------------------------------
# Normalisation and validation (run by __post_init__; idempotent)
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_NONE = type(None)
_JSON_DICT = ("lr_scheduler_kwargs", "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")  # a str must be a JSON object
_JSON_OR_PATH = ("fsdp_config", "deepspeed", "accelerator_config", "generation_config")  # '{...}' or a path/name
_STEP_FIELDS = {"logging_steps": "logging_strategy", "eval_steps": "eval_strategy", "save_steps": "save_strategy"}
_CHOICES: dict[str, tuple[str, ...]] = {
    "eval_strategy": INTERVAL_STRATEGIES, "logging_strategy": INTERVAL_STRATEGIES, "save_strategy": SAVE_STRATEGIES,
    "hub_strategy": HUB_STRATEGIES, "lr_scheduler_type": LR_SCHEDULERS, "optim": OPTIMIZERS,
    "log_level": LOG_LEVELS, "log_level_replica": LOG_LEVELS, "half_precision_backend": HALF_PRECISION_BACKENDS,
    "fp16_backend": HALF_PRECISION_BACKENDS, "ddp_backend": DDP_BACKENDS, "precision": PRECISIONS,
    "train_sampling_strategy": TRAIN_SAMPLING_STRATEGIES, "include_num_input_tokens_seen": TOKENS_SEEN,
    "dataloader_multiprocessing_context": MULTIPROCESSING_CONTEXTS,
}
# (option, predicate on a non-None value, requirement shown in the error)
_RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("per_device_train_batch_size", lambda v: v >= 1, ">= 1 (samples per device)"),
    ("per_device_eval_batch_size", lambda v: v >= 1, ">= 1 (samples per device)"),
    ("gradient_accumulation_steps", lambda v: v >= 1, ">= 1 (micro-batches per optimizer step)"),
    ("eval_accumulation_steps", lambda v: v >= 1, ">= 1 or None"),
    ("learning_rate", lambda v: v >= 0, ">= 0"),
    ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("adam_beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("adam_beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("adam_epsilon", lambda v: v >= 0, ">= 0"),
    ("max_grad_norm", lambda v: v >= 0, ">= 0 (0 disables clipping)"),
    ("warmup_ratio", lambda v: 0 <= v <= 1, "in [0, 1] (fraction of total steps)"),
    ("warmup_steps", lambda v: v >= 0, ">= 0 (optimizer steps)"),
    ("eval_delay", lambda v: v >= 0, ">= 0 (epochs or steps)"),
    ("save_total_limit", lambda v: v >= 0, ">= 0 or None"),
    ("dataloader_num_workers", lambda v: v >= 0, ">= 0 (worker processes)"),
    ("dataloader_prefetch_factor", lambda v: v >= 1, ">= 1 (batches per worker) or None"),
    ("label_smoothing_factor", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("neftune_noise_alpha", lambda v: v > 0, "> 0 or None"),
    ("ddp_timeout", lambda v: v > 0, "> 0 (seconds) or None"),
    ("ddp_bucket_cap_mb", lambda v: v > 0, "> 0 (MiB) or None"),
    ("fsdp_min_num_params", lambda v: v >= 0, ">= 0 (parameters)"),
    ("tpu_num_cores", lambda v: v >= 1, ">= 1 or None"),
    ("num_nodes", lambda v: v >= 1, ">= 1"),
    ("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1] (the range numpy's seed accepts)"),
    ("data_seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32 - 1] or None"),
    ("local_rank", lambda v: v >= -1, ">= -1"),
    ("generation_max_length", lambda v: v >= 1, ">= 1 (tokens) or None"),
    ("generation_num_beams", lambda v: v >= 1, ">= 1 or None"),
    ("torch_empty_cache_steps", lambda v: v > 0, "an integer > 0 (optimizer steps) or None"),
)


def _type_error(name: str, value: Any, kinds: tuple[type, ...]) -> ValueError:
    expected = " | ".join("None" if k is _NONE else k.__name__ for k in kinds)
    return ValueError(f"FitArguments.{name} must be {expected}, got {shown(name, value)} ({type(value).__name__}).")


def _number(text: str) -> int | float | None:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return None


def _coerce(name: str, value: Any, kinds: tuple[type, ...]) -> Any:
    """Check ``value`` against the option's types; convert strings (YAML ``5e-5``, CLI text) where unambiguous.
    Numbers must be finite (no option takes NaN or inf)."""
    out = _coerce_kind(name, value, kinds)
    if isinstance(out, float) and not math.isfinite(out):
        raise ValueError(f"FitArguments.{name} must be a finite number, got {shown(name, value)}.")
    return out


def _coerce_kind(name: str, value: Any, kinds: tuple[type, ...]) -> Any:
    # a field of another type a user subclass declares (e.g. torch.dtype, as HF allows): its own values pass,
    # a dtype's name (from to_dict / JSON) becomes the dtype again
    other = tuple(k for k in kinds if isinstance(k, type) and k not in (bool, int, float, str, list, dict, _NONE))
    if other and isinstance(value, other):
        return value
    if other and isinstance(value, str):
        import torch

        if torch.dtype in other and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    if value is None:
        if _NONE in kinds:
            return None
    elif isinstance(value, bool):
        if bool in kinds:
            return value
    elif isinstance(value, int):
        if int in kinds or float in kinds:
            return value
    elif isinstance(value, float):
        if float in kinds:
            return value
        if int in kinds and value.is_integer():
            return int(value)
    elif isinstance(value, str):
        if str in kinds and bool in kinds and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"  # str | bool options (resume_from_checkpoint, fsdp)
        if str in kinds:
            return value
        text = value.strip()
        if _NONE in kinds and text.lower() in ("none", "null", ""):
            return None
        if bool in kinds and text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        number = _number(text) if (int in kinds or float in kinds) else None
        if number is not None and (float in kinds or isinstance(number, int)):
            return number
        if (list in kinds or dict in kinds) and text[:1] in ("[", "{"):
            decoded = _json_or_none(text)
            if isinstance(decoded, tuple(k for k in (list, dict) if k in kinds)):
                return decoded
        if list in kinds and text:
            return [text]
    elif isinstance(value, (list, tuple)):
        if list in kinds:
            return list(value)
    elif isinstance(value, dict) and dict in kinds:
        return dict(value)
    raise _type_error(name, value, kinds)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _json_object(name: str, text: str) -> dict:
    decoded = _json_or_none(text)
    if not isinstance(decoded, dict):
        raise ValueError(f"FitArguments.{name} must be a dict or a JSON object string, got {shown(name, text)}.")
    return decoded


def _words(name: str, value: Any) -> list[str]:
    """A space/comma separated string, JSON list string or list -> list of str."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = _json_or_none(text)
            if not isinstance(value, list):
                raise ValueError(f"FitArguments.{name}: cannot parse {shown(name, text)} as a JSON list.")
        else:
            return text.replace(",", " ").split()
    return [str(v) for v in value]


def _check_empty_cache_steps(value: Any) -> None:
    """HF accepts only a positive ``int`` (or None) for ``torch_empty_cache_steps``: a float or a word is refused
    before coercion would round or drop it (a string of digits, as a command line gives, counts as an int)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return
    if isinstance(value, str) and value.strip().isdigit():
        return
    raise ValueError(f"torch_empty_cache_steps must be an integer > 0 (optimizer steps) or None, got {value!r}.")


def _normalize(a: Any) -> None:
    if a.precision is not None and not isinstance(a.precision, bool) and str(a.precision) in PRECISION_ALIASES:
        a.precision = PRECISION_ALIASES[str(a.precision)]  # Lightning's short names: "bf16", 16, 32, ...
    if a.lr_scheduler_kwargs is None:
        a.lr_scheduler_kwargs = {}
    if a.output_dir is None:
        a.output_dir = "trainer_output"  # HF 5's default folder
    _check_empty_cache_steps(a.torch_empty_cache_steps)
    if a.fsdp is None:
        a.fsdp = ""
    if a.debug is None:  # HfArgumentParser gives None for an unset list option (HF accepts it too)
        a.debug = ""
    if a.trackio_static_space_id is False:  # HF: False disables the static Space
        a.trackio_static_space_id = None
    if isinstance(a.include_num_input_tokens_seen, bool) or a.include_num_input_tokens_seen is None:
        a.include_num_input_tokens_seen = "all" if a.include_num_input_tokens_seen else "no"  # HF 5: bool -> str
    for name in a.field_names():
        kinds = field_kinds(type(a), name)
        if object not in kinds:  # parallelism_config holds an accelerate object: checked in _validate
            setattr(a, name, _coerce(name, getattr(a, name), kinds))
    from taskfit.arguments.legacy import apply_legacy_options

    apply_legacy_options(a)  # 4.x spellings -> HF 5 options, with a FutureWarning
    if a.torch_compile_backend is not None or a.torch_compile_mode is not None:
        a.torch_compile = True  # HF: setting a backend or mode implies torch_compile
    if a.torch_compile and a.torch_compile_backend is None:
        a.torch_compile_backend = "inductor"  # HF's default backend, visible in the arguments
    if a.use_cpu:
        a.dataloader_pin_memory = False  # HF: no pinned memory without a device to copy to
    for name in ("output_dir", "logging_dir"):  # HF expands a leading ~ (fsspec URLs have none)
        value = getattr(a, name)
        if isinstance(value, str) and value.startswith("~"):
            setattr(a, name, os.path.expanduser(value))
    for name in _JSON_DICT:
        if isinstance(getattr(a, name), str):
            setattr(a, name, _json_object(name, getattr(a, name)))
    for name in _JSON_OR_PATH:
        value = getattr(a, name)
        if isinstance(value, str) and value.strip().startswith("{"):
            setattr(a, name, _json_object(name, value))
    if isinstance(a.optim_args, str):
        a.optim_args = _parse_optim_args(a.optim_args)
    _normalize_lists(a)
    _warn_unused_config_file(a)
    a.devices = _normalize_devices(a.devices)
    for name in _STEP_FIELDS:  # HF: a value > 1 is a number of steps and must be an integer
        value = getattr(a, name)
        if value is not None and value >= 1:
            if value != int(value):
                raise ValueError(f"{name} must be an integer (optimizer steps) when >= 1, or a ratio < 1; got {value!r}.")
            setattr(a, name, int(value))
    if a.eval_strategy == "steps" and a.eval_steps is None and a.logging_steps > 0:
        a.eval_steps = a.logging_steps  # HF: eval_steps defaults to logging_steps
    if a.eval_strategy in ("steps", "epoch"):
        a.do_eval = True
    if a.save_strategy == "best" and a.metric_for_best_model is None and not a.load_best_model_at_end \
            and a.eval_strategy != "no":  # HF's Trainer raises (its words); eval "no" has its own error below
        raise ValueError("`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
                         "`args.load_best_model_at_end` is set to `True`.")
    if (a.load_best_model_at_end or a.save_strategy == "best" or a.lr_scheduler_type == "reduce_lr_on_plateau") \
            and a.metric_for_best_model is None:
        a.metric_for_best_model = "loss"
    if a.greater_is_better is None and a.metric_for_best_model is not None:
        a.greater_is_better = not a.metric_for_best_model.endswith("loss")


def _parse_optim_args(text: str) -> dict | None:
    """``'{"a": 1}'`` or HF's ``'a=1,b=x'`` -> dict (values JSON-decoded where possible); ``''`` -> None."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("{"):
        return _json_object("optim_args", text)
    out = {}
    for pair in text.split(","):
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"optim_args must be a dict, a JSON object or 'key=value,key2=value2'; got {shown('optim_args', text)}.")
        decoded = _json_or_none(raw.strip())
        out[key.strip()] = raw.strip() if decoded is None else decoded
    for key, value in out.items():  # numeric optimizer settings given as words fail later, deep in the optimizer
        if key.strip() in _NUMERIC_OPTIM_ARGS and isinstance(value, str):
            raise ValueError(f"optim_args {key}={value!r} in {text!r} is not a number; {key} takes a number "
                             f"(e.g. {key}=0.001).")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"optim_args {key}={value!r} in {text!r} must be a finite number.")
    return out


#: optimizer keyword arguments that are numbers in every torch / bitsandbytes optimizer that has them
_NUMERIC_OPTIM_ARGS = frozenset({"lr", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
                                 "initial_accumulator_value", "rho", "clip_threshold", "decay_rate"})


def report_to_names(value: Any) -> list[str]:
    """``report_to`` as a list of logger names: ``None`` -> ``["csv"]``, ``"none"`` -> ``[]``, ``"all"`` -> every
    installed logger (mirrors HF's ``report_to`` handling).

    Raises:
        ValueError: an unknown name (with the valid choices), or ``"none"`` mixed with loggers.
    """
    names = _words("report_to", "csv" if value is None else value)
    for name in names:
        if name not in REPORT_TO:
            raise invalid_choice("report_to logger", name, REPORT_TO)
    if "none" in names:
        if set(names) != {"none"}:
            raise ValueError(f"report_to={names!r} mixes 'none' with loggers; use 'none' alone or list loggers.")
        names = []
    expanded = [n for name in names for n in (installed_loggers() if name == "all" else (name,))]
    # HF 5 auto-enables its Kubeflow callback inside a TrainJob, even over "none"; the callback is transformers'
    # own, so a run without transformers (an optional dependency) is left as it is rather than made to fail
    if kubeflow_available() and transformers_installed():
        expanded.append("kubeflow")
    return list(dict.fromkeys(expanded))


def fsdp_words(value: Any) -> list[str]:
    """``fsdp`` as a list of FSDP option words (``True`` -> ``["full_shard"]``, ``"full_shard auto_wrap"`` ->
    two words; mirrors HF's ``fsdp`` parsing).

    Raises:
        ValueError: an unknown word (with the valid choices).
    """
    words = (["full_shard"] if value else []) if isinstance(value, bool) else _words("fsdp", value)
    for option in words:
        if option not in FSDP_OPTIONS:
            raise invalid_choice("fsdp option", option, FSDP_OPTIONS)
    return words


def _normalize_lists(a: Any) -> None:
    a.report_to = report_to_names(a.report_to)
    a.fsdp = fsdp_words(a.fsdp)
    a.debug = _words("debug", a.debug)
    for option in a.debug:
        if option not in DEBUG_OPTIONS:
            raise invalid_choice("debug option", option, DEBUG_OPTIONS)
    if a.label_names is not None:
        a.label_names = [str(n) for n in a.label_names]


def _warn_unused_config_file(a: Any) -> None:
    """``fsdp_config`` naming a missing file is an error when FSDP is used (when it is read) and a warning when it
    is not (the value is ignored, but it is most likely a typo)."""
    import logging
    import os

    value = a.fsdp_config
    if isinstance(value, (str, os.PathLike)) and str(value).strip() and not os.path.isfile(str(value)):
        if not a.fsdp and str(getattr(a, "strategy", "") or "").split("_")[0] not in ("fsdp", "fsdp2", "xla"):
            logging.getLogger("taskfit").warning(
                "fsdp_config=%r: no such file; ignored because FSDP is not used (set fsdp or strategy='fsdp' to "
                "use it, or remove the option).", str(value))


def _normalize_devices(devices: Any) -> int | str | list[int]:
    """``"auto"``, an int (-1 = all, else >= 1), or a non-empty list of distinct indices >= 0; digit strings
    (``"2"``, ``"0,1"``, ``"[0, 1]"``) are converted."""
    value = devices
    if isinstance(value, str):
        text = value.strip()
        if text == "auto":
            return text
        if text.lstrip("-").isdigit():
            value = int(text)
        elif text.startswith("["):
            value = _json_or_none(text)
        elif text.replace(",", "").replace(" ", "").isdigit():
            value = [int(t) for t in text.split(",") if t.strip()]
    if isinstance(value, int) and not isinstance(value, bool) and (value == -1 or value >= 1):
        return value
    if isinstance(value, list):
        value = [int(i) if isinstance(i, str) and i.strip().isdigit() else i for i in value]
    if isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                   for i in value) and len(set(value)) == len(value):
        return value
    raise ValueError(f"devices={devices!r} is invalid: use 'auto', -1 (all), a count >= 1, or a list of distinct "
                     "device indices such as [0, 1].")


def _validate(a: Any) -> None:
    for name, choices in _CHOICES.items():
        value = getattr(a, name)
        if value is not None and value not in choices:
            raise invalid_choice(name, value, choices)
    unsupported = {
        "fp16_opt_level": (a.fp16_opt_level != "O1", ("it selects an Apex AMP level; apex is not supported, use "
                                                      "native AMP (fp16=True or precision='16-mixed')")),
        "half_precision_backend": (a.half_precision_backend == "apex", ("apex is not supported; use native AMP "
                                                                        "(half_precision_backend='auto')")),
        "use_ipex": (a.use_ipex, "Intel Extension for PyTorch is not supported"),
        "jit_mode_eval": (a.jit_mode_eval, "jit-traced evaluation is not supported; use torch_compile"),
        "use_legacy_prediction_loop": (a.use_legacy_prediction_loop, "there is one prediction loop"),
        "past_index": (a.past_index != -1, ("feeding past hidden states (mems) is not supported; handle it in "
                                            "the TaskModule")),
        "mp_parameters": (bool(a.mp_parameters), "SageMaker model parallelism is not supported"),
        # HF 5 options taskfit cannot honour: refused rather than silently ignored
        "use_liger_kernel": (a.use_liger_kernel, "Liger kernels patch HF models with Triton (CUDA) kernels; taskfit "
                                                 "does not apply them (apply liger_kernel to the model yourself)"),
        "liger_kernel_config": (a.liger_kernel_config is not None, "Liger kernels are not applied by taskfit"),
        "parallelism_config": (a.parallelism_config is not None, ("accelerate's N-D parallelism is not used; pick "
                                                                   "strategy='ddp' | 'fsdp' | 'deepspeed' instead")),
        "train_sampling_strategy": (a.train_sampling_strategy == "batch_rebalance",
                                    "'batch_rebalance' is not built; use 'random', 'sequential' or 'group_by_length'"),
        "hub_revision": (a.push_to_hub and a.hub_revision is not None, ("taskfit publishes to an fsspec store, "
                                                                         "which has no branches; unset hub_revision")),
    }
    for name, (bad, reason) in unsupported.items():
        if bad:
            raise ValueError(f"{name}={shown(name, getattr(a, name))} is not supported: {reason}.")
    for name, ok, requirement in _RANGES:
        value = getattr(a, name)
        if value is not None and not ok(value):
            raise ValueError(f"{name} must be {requirement}, got {shown(name, value)}.")
    for name, strategy in _STEP_FIELDS.items():
        value = getattr(a, name)
        if getattr(a, strategy) == "steps" and (value is None or value <= 0):
            raise ValueError(f"{strategy}='steps' needs {name} > 0 (steps, or a ratio < 1 of total steps), got {value!r}.")
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}.")
    if a.max_steps <= 0 and not a.num_train_epochs > 0:
        raise ValueError(f"num_train_epochs must be > 0 when max_steps <= 0, got num_train_epochs={a.num_train_epochs!r}.")
    if a.dataloader_num_workers == 0 and a.dataloader_prefetch_factor is not None:
        raise ValueError("dataloader_prefetch_factor can only be set when dataloader_num_workers > 0, got "
                         f"dataloader_prefetch_factor={a.dataloader_prefetch_factor!r} with 0 workers.")
    if a.dataloader_num_workers == 0 and a.dataloader_persistent_workers:
        raise ValueError("dataloader_persistent_workers=True needs dataloader_num_workers > 0.")
    for item in a.include_for_metrics:
        if item not in INCLUDE_FOR_METRICS:
            raise invalid_choice("include_for_metrics item", item, INCLUDE_FOR_METRICS)
    if a.enable_jit_checkpoint and a.save_on_interrupt is False:
        raise ValueError("enable_jit_checkpoint=True (checkpoint on SIGTERM) contradicts save_on_interrupt=False; "
                         "set only one of them.")
    _warn_ignored(a)
    _validate_conflicts(a)
    from taskfit.debugging import validate_debug_options  # Lightning's debugging switches

    validate_debug_options(a)


def _warn_ignored(a: Any) -> None:
    """Options that change nothing in taskfit's results but that it does not apply: a warning names each."""
    import warnings

    ignored = {
        "dataloader_in_order": (not a.dataloader_in_order, "batches are always returned in order"),
        "trackio_space_id": (a.trackio_space_id is not None, "there is no trackio logger"),
        "trackio_bucket_id": (a.trackio_bucket_id is not None, "there is no trackio logger"),
        "trackio_static_space_id": (a.trackio_static_space_id not in (None, False), "there is no trackio logger"),
    }
    for name, (set_, why) in ignored.items():
        if set_:
            warnings.warn(f"{name}={shown(name, getattr(a, name))} has no effect in taskfit: {why}.", UserWarning, stacklevel=5)


def _validate_conflicts(a: Any) -> None:
    if a.fp16 and a.bf16:
        raise ValueError("fp16=True and bf16=True: at most one of fp16 and bf16 can be True.")
    if a.fp16_full_eval and a.bf16_full_eval:
        raise ValueError("fp16_full_eval=True and bf16_full_eval=True: at most one can be True.")
    for flag, implied in (("fp16", "16-mixed"), ("bf16", "bf16-mixed")):
        if getattr(a, flag) and a.precision is not None and a.precision != implied:
            raise ValueError(f"precision={a.precision!r} contradicts {flag}=True (which means precision={implied!r}); "
                             "set only one of them.")
    if a.use_cpu and a.accelerator not in ("auto", "cpu"):
        raise ValueError(f"use_cpu=True contradicts accelerator={a.accelerator!r}; use accelerator='cpu'.")
    if a.load_best_model_at_end and a.save_strategy != "best":
        if a.eval_strategy != a.save_strategy:
            raise ValueError("load_best_model_at_end=True requires the save and eval strategy to match, got "
                             f"eval_strategy={a.eval_strategy!r} and save_strategy={a.save_strategy!r}.")
        if a.eval_strategy == "steps":
            save, every = a.save_steps, a.eval_steps
            if (save < 1) != (every < 1):
                raise ValueError("load_best_model_at_end=True requires save_steps to be a multiple of eval_steps, "
                                 f"which mixing a ratio and absolute steps cannot guarantee: save_steps={save!r}, "
                                 f"eval_steps={every!r}.")
            if round(save * 1_000_000) % round(every * 1_000_000) != 0:
                raise ValueError("load_best_model_at_end=True requires save_steps to be a round multiple of "
                                 f"eval_steps, got save_steps={save!r} and eval_steps={every!r}.")
    if a.save_strategy == "best" and a.eval_strategy == "no":
        raise ValueError("save_strategy='best' needs evaluation: set eval_strategy to 'steps' or 'epoch'.")
    if a.lr_scheduler_type == "reduce_lr_on_plateau" and a.eval_strategy == "no":
        raise ValueError("lr_scheduler_type='reduce_lr_on_plateau' needs evaluation: set eval_strategy to 'steps' "
                         "or 'epoch'.")
    _check_fsdp_words(a.fsdp)


def _check_fsdp_words(words: list[str]) -> None:
    if words == ["offload"]:
        raise ValueError("fsdp='offload' cannot work on its own; add 'full_shard' or 'shard_grad_op'.")
    if "full_shard" in words and "shard_grad_op" in words:
        raise ValueError("fsdp cannot contain both 'full_shard' and 'shard_grad_op'.")


def field_kinds(cls: type, name: str) -> tuple[type, ...]:
    """The plain types option ``name`` of dataclass ``cls`` accepts: ``int | None`` -> ``(int, NoneType)``,
    ``list[int]`` -> ``(list,)``, ``CountOrFraction | None`` -> ``(int, float, NoneType)``.

    Raises:
        ValueError: unknown option (with "Did you mean").
    """
    hints = _type_hints(cls)
    if name not in hints:
        raise invalid_choice(f"{cls.__name__} option", name, hints)
    hint = hints[name]
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    from taskfit.arguments.fields import EXTRA_KINDS

    kinds: list[type] = []
    for arg in args:  # a converter type (FlagOrCount, CountOrFraction) stands for the kinds it accepts
        kinds.extend(getattr(arg, "kinds", None) or (typing.get_origin(arg) or arg,))
    return tuple(kinds) + EXTRA_KINDS.get(name, ())


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    # from the class annotations, not Field.type, which transformers' HfArgumentParser overwrites in place
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def normalize_and_validate(a: Any) -> None:
    """Normalise then validate a `FitArguments` in place (its ``__post_init__``; idempotent).

    Raises:
        ValueError: a bad value, a conflict between options, or an option taskfit does not support.
    """
    _normalize(a)
    _validate(a)


def check_values(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value) of the options dataclass ``cls`` normalised and checked one option at a
    time by the rules ``FitArguments`` applies to the same names: types (text converted where unambiguous),
    Lightning's precision aliases, JSON object strings decoded, ``devices`` and ``fsdp`` parsed, ``report_to``
    listed, choices and ranges checked. For option sets smaller than ``FitArguments`` (``Engine``'s).

    Args:
        cls (type): a dataclass whose annotations give each option's types.
        values (dict[str, Any]): the given options.

    Returns:
        dict[str, Any]: the normalised values, same keys.

    Raises:
        ValueError: a bad value (naming it and the valid choices), an option ``cls`` does not have.
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name == "precision" and value is not None and not isinstance(value, bool) \
                and str(value) in PRECISION_ALIASES:  # Lightning's short names: "bf16", 16, 32, ...
            value = PRECISION_ALIASES[str(value)]
        value = _coerce(name, value, field_kinds(cls, name))
        if name == "lr_scheduler_kwargs" and value is None:
            value = {}
        if isinstance(value, str) and (name in _JSON_DICT or (name in _JSON_OR_PATH and value.strip().startswith("{"))):
            value = _json_object(name, value)
        if name == "devices":
            value = _normalize_devices(value)
        elif name == "fsdp":
            value = fsdp_words("" if value is None else value)
            _check_fsdp_words(value)
        elif name == "report_to":
            value = report_to_names(value)
        if name in _CHOICES and value is not None and value not in _CHOICES[name]:
            raise invalid_choice(name, value, _CHOICES[name])
        for option, ok, requirement in _RANGES:
            if option == name and value is not None and not ok(value):
                raise ValueError(f"{name} must be {requirement}, got {shown(name, value)}.")
        out[name] = value
    return out
