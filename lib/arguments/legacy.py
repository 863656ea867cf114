"""The transformers 4.x option spellings that transformers 5 removed, still accepted by `FitArguments`.

A script written for transformers 4.x keeps running: each removed name is a field here. Setting one to a
non-default value emits a ``FutureWarning`` naming the HF 5 option, and the value is copied there
(:func:`apply_legacy_options`). Names with no HF 5 counterpart either keep working as taskfit options
(``logging_dir``, ``save_safetensors``, ``include_tokens_per_second``, ``split_batches``, ...), have no effect
(``overwrite_output_dir``, ``tpu_num_cores``, ``ray_scope``: a warning says so), or are refused when set
(apex, IPEX, jit evaluation, the legacy prediction loop, ``past_index``, SageMaker ``mp_parameters``: a
``ValueError`` from validation).
"""

import warnings
from dataclasses import dataclass
from typing import Any

from taskfit.arguments.fields import _opt
from taskfit.redact import shown


@dataclass(repr=False)
class LegacyFields:
    """transformers 4.x ``TrainingArguments`` fields removed in 5.x (see the module docstring)."""

    overwrite_output_dir: bool = _opt(False, "Removed in transformers 5; has no effect (taskfit never deletes output_dir).", "compat")
    per_gpu_train_batch_size: int | None = _opt(None, "Deprecated alias of per_device_train_batch_size.", "compat")
    per_gpu_eval_batch_size: int | None = _opt(None, "Deprecated alias of per_device_eval_batch_size.", "compat")
    warmup_ratio: float = _opt(0.0, "Deprecated (HF 5): use warmup_steps=<ratio in (0, 1)>; fraction of total steps in [0, 1].", "compat")
    logging_dir: str | None = _opt(None, "Directory for logger output; None = <output_dir>/logs (removed in HF 5, honoured by taskfit).", "logging")
    save_safetensors: bool | None = _opt(True, "Write weights as safetensors instead of torch.save pickles (removed in HF 5, honoured by taskfit).", "checkpoint")
    no_cuda: bool = _opt(False, "Deprecated alias of use_cpu.", "compat")
    use_mps_device: bool = _opt(False, "Deprecated (MPS is picked automatically); use accelerator='mps'.", "compat")
    jit_mode_eval: bool = _opt(False, "Not supported (PyTorch jit trace for inference); must stay False.", "compat")
    use_ipex: bool = _opt(False, "Not supported (Intel Extension for PyTorch); must stay False.", "compat")
    fp16_opt_level: str = _opt("O1", "Apex AMP level; only 'O1' (native AMP) is accepted.", "compat")
    half_precision_backend: str = _opt("auto", "Mixed-precision backend: auto | cpu_amp ('apex' is not supported).", "compat")
    tpu_num_cores: int | None = _opt(None, "Removed in HF 5; has no effect (the launcher sets the cores).", "compat")
    tpu_metrics_debug: bool = _opt(False, "Deprecated: use debug='tpu_metrics_debug'.", "compat")
    past_index: int = _opt(-1, "Not supported (TransformerXL/XLNet mems); must stay -1.", "compat")
    fsdp_min_num_params: int = _opt(0, "Deprecated: FSDP size-based auto-wrap threshold (parameters); use fsdp_config.", "compat")
    fsdp_transformer_layer_cls_to_wrap: str | None = _opt(None, "Deprecated: layer class name(s) to auto-wrap; use fsdp_config.", "compat")
    adafactor: bool = _opt(False, "Deprecated: use optim='adafactor'.", "compat")
    group_by_length: bool = _opt(False, "Deprecated (HF 5): use train_sampling_strategy='group_by_length' (mirrors it).", "compat")
    use_legacy_prediction_loop: bool = _opt(False, "Not supported (HF legacy prediction loop); must stay False.", "compat")
    include_inputs_for_metrics: bool = _opt(False, "Deprecated: use include_for_metrics=['inputs'] (mirrors it).", "compat")
    fp16_backend: str = _opt("auto", "Deprecated alias of half_precision_backend.", "compat")
    evaluation_strategy: str | None = _opt(None, "Deprecated alias of eval_strategy.", "compat")
    push_to_hub_model_id: str | None = _opt(None, "Deprecated: use hub_model_id.", "compat")
    push_to_hub_organization: str | None = _opt(None, "Deprecated: use hub_model_id='<organization>/<name>'.", "compat")
    push_to_hub_token: str | None = _opt(None, "Deprecated: use hub_token (redacted in logs).", "compat")
    mp_parameters: str = _opt("", "Not supported (SageMaker model-parallel parameters); must stay empty.", "compat")
    torchdynamo: str | None = _opt(None, "Deprecated: use torch_compile_backend.", "compat")
    ray_scope: str | None = _opt("last", "Removed in HF 5; Ray Tune checkpoint scope (stored, not read).", "compat")
    dispatch_batches: bool | None = _opt(None, "Deprecated Accelerate option: use accelerator_config={'dispatch_batches': ...}.", "compat")
    split_batches: bool | None = _opt(None, "Deprecated Accelerate option: use accelerator_config={'split_batches': ...}.", "compat")
    include_tokens_per_second: bool | None = _opt(False, "Report training tokens per second per device (removed in HF 5, honoured by taskfit).", "evaluation")


#: 4.x name -> (its default, the HF 5 option that replaces it). The value is copied into the new option.
RENAMED: dict[str, tuple[Any, str]] = {
    "evaluation_strategy": (None, "eval_strategy"),
    "per_gpu_train_batch_size": (None, "per_device_train_batch_size"),
    "per_gpu_eval_batch_size": (None, "per_device_eval_batch_size"),
    "no_cuda": (False, "use_cpu"),
    "torchdynamo": (None, "torch_compile_backend"),
    "push_to_hub_model_id": (None, "hub_model_id"),
    "push_to_hub_token": (None, "hub_token"),
}
#: 4.x names with no effect in taskfit (a non-default value warns that it is ignored).
NO_EFFECT = {"overwrite_output_dir": False, "tpu_num_cores": None, "ray_scope": "last"}


def _future(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated (removed in transformers 5); use {new} instead.", FutureWarning, stacklevel=6)


def _rename(a: Any, old: str, new: str, old_default: Any, new_default: Any) -> None:
    """Copy the deprecated option ``old`` into ``new`` (conflict -> ValueError) and reset ``old``."""
    value = getattr(a, old)
    if value == old_default:
        return
    current = getattr(a, new)
    if current != new_default and current != value:
        raise ValueError(f"{old}={shown(old, value)} (deprecated alias of {new}) conflicts with "
                         f"{new}={shown(new, current)}; set only {new}.")
    _future(old, f"{new}={shown(new, value)}")
    setattr(a, new, value)
    setattr(a, old, old_default)


def apply_legacy_options(a: Any) -> None:
    """Map every set 4.x option onto its HF 5 option, with a ``FutureWarning`` naming the new one (run by
    ``FitArguments.__post_init__`` after type coercion, before validation).

    Mirrored pairs (``group_by_length`` / ``train_sampling_strategy``, ``include_inputs_for_metrics`` /
    ``include_for_metrics``, ``gradient_checkpointing`` / ``activation_checkpointing``) keep the old name equal to
    what the new one implies, so code that reads the old name keeps working and a round trip through
    :meth:`~taskfit.arguments.fit_arguments.FitArguments.to_dict` warns nothing.

    Raises:
        ValueError: a deprecated option contradicting the option that replaces it.
    """
    for old, (old_default, new) in RENAMED.items():
        new_default = {"eval_strategy": "no", "use_cpu": False}.get(new, 8 if "batch_size" in new else None)
        _rename(a, old, new, old_default, new_default)
    _rename(a, "fp16_backend", "half_precision_backend", "auto", "auto")
    if a.push_to_hub_organization is not None:
        name = a.hub_model_id or (a.output_dir or "trainer_output").rstrip("/").split("/")[-1]
        if "/" not in name:
            a.hub_model_id = f"{a.push_to_hub_organization}/{name}"
        _future("push_to_hub_organization", f"hub_model_id={shown('hub_model_id', a.hub_model_id)}")
        a.push_to_hub_organization = None
    if a.warmup_ratio and a.warmup_ratio < 1 and not a.warmup_steps:  # 1.0 stays: warmup_steps=1 means one step
        _future("warmup_ratio", f"warmup_steps={a.warmup_ratio!r} (a float < 1 is a ratio)")
        a.warmup_steps, a.warmup_ratio = a.warmup_ratio, 0.0
    elif a.warmup_ratio:
        _future("warmup_ratio", "warmup_steps (a float < 1 is a ratio of total steps)")
    if a.adafactor:
        if a.optim not in ("adamw_torch", "adamw_torch_fused", "adafactor"):
            raise ValueError(f"adafactor=True (deprecated, means optim='adafactor') conflicts with optim={a.optim!r}.")
        _future("adafactor=True", "optim='adafactor'")
        a.optim, a.adafactor = "adafactor", False
    if a.tpu_metrics_debug:
        _future("tpu_metrics_debug=True", "debug='tpu_metrics_debug'")
        words = a.debug.split() if isinstance(a.debug, str) else list(a.debug or [])
        a.debug = words + [w for w in ("tpu_metrics_debug",) if w not in words]
        a.tpu_metrics_debug = False
    if a.use_mps_device:
        _future("use_mps_device=True", "accelerator='mps' (MPS is chosen automatically when available)")
    for old in ("dispatch_batches", "split_batches"):
        if getattr(a, old) is not None:
            _future(old, f"accelerator_config={{'{old}': {getattr(a, old)!r}}}")
    for old in ("fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap"):
        if getattr(a, old):
            _future(old, f"fsdp_config={{'{old.removeprefix('fsdp_')}': ...}}")
    for old, default in NO_EFFECT.items():
        if getattr(a, old) != default:
            warnings.warn(f"{old}={shown(old, getattr(a, old))} was removed in transformers 5 and has no effect in taskfit.",
                          FutureWarning, stacklevel=5)
    _mirror(a)


def _mirror(a: Any) -> None:
    """Keep each 4.x name equal to what its HF 5 replacement implies (warning when the old name was set alone)."""
    # group_by_length <-> train_sampling_strategy (sortish_sampler, a seq2seq option, means the same)
    if a.group_by_length and a.train_sampling_strategy not in ("random", "group_by_length"):
        raise ValueError(f"group_by_length=True (deprecated: train_sampling_strategy='group_by_length') conflicts "
                         f"with train_sampling_strategy={a.train_sampling_strategy!r}; set only the latter.")
    if (a.group_by_length or a.sortish_sampler) and a.train_sampling_strategy == "random":
        if a.group_by_length:
            _future("group_by_length=True", "train_sampling_strategy='group_by_length'")
        a.train_sampling_strategy = "group_by_length"
    a.group_by_length = a.train_sampling_strategy == "group_by_length"
    # include_inputs_for_metrics <-> include_for_metrics
    include = list(a.include_for_metrics or [])
    if a.include_inputs_for_metrics and "inputs" not in include:
        _future("include_inputs_for_metrics=True", "include_for_metrics=['inputs']")
        include.append("inputs")
    a.include_for_metrics = include
    a.include_inputs_for_metrics = "inputs" in include
    # gradient_checkpointing* -> activation_checkpointing* (HF 5 does the same, with the same warning)
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if getattr(a, new) is None and getattr(a, old) is not None:
            if getattr(a, old) not in (False, {}):
                _future(old, new)
            setattr(a, new, getattr(a, old))
        setattr(a, old, getattr(a, new))
    if a.activation_checkpointing is None:
        a.activation_checkpointing = a.gradient_checkpointing = False
