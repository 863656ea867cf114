"""Lightning ``Trainer`` flags -> ``FitArguments`` fields and the loop policy, and the flags taskfit refuses (named,
before any work)."""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from ast import literal_eval
from datetime import timedelta
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_only
from taskfit.accelerators import choose_accelerator
from taskfit.errors import configuration_error
from taskfit.lightning.log_hooks import LOG_HOOKS
from taskfit.lightning.trainer_state import trainer_fn
from taskfit.loops.policy import LoopPolicy

_log = logging.getLogger("taskfit")
_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
           "overfit_batches", "val_check_interval")

#: Lightning flags with no taskfit equivalent: name -> the values that are accepted (anything else raises).
_UNSUPPORTED = {"sync_batchnorm": (False,), "model_registry": (None,),
                "benchmark": (None, False)}


def _check_batch_limits(flags: dict[str, Any]) -> None:
    """Lightning's ``_determine_batch_limits`` for the numeric ``limit_*_batches``, ``overfit_batches`` and
    ``val_check_interval`` of ``flags``: a value in [0.0, 1.0] stays, a whole float above 1 becomes that int (in
    place: ``2.0`` counts 2 batches), anything else raises Lightning's configuration error naming the value; so
    does a negative ``fast_dev_run``."""
    fdr = flags["fast_dev_run"]
    if isinstance(fdr, int) and fdr < 0:
        raise configuration_error(f"fast_dev_run={fdr!r} is not a valid configuration. It should be >= 0.")
    for name in _LIMITS:
        v = flags[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or 0 <= v <= 1:
            continue  # None, a time interval (checked with the schedule) or a fraction
        if v > 1 and v % 1.0 == 0:
            flags[name] = int(v)
            continue
        raise configuration_error(f"You have passed invalid value {v} for {name}, it has to be in [0.0, 1.0] or an "
                                  "int.")  # Lightning's message


def _refuse_unsupported(flags: dict[str, Any]) -> None:
    """Raise NotImplementedError naming the first flag of ``flags`` outside its accepted values."""
    for name, ok in _UNSUPPORTED.items():
        if flags[name] not in ok:
            raise NotImplementedError(f"Trainer({name}={flags[name]!r}) is not supported by taskfit.lightning "
                                      f"(accepted: {ok}); see docs/lightning.md.")
    vci, every = flags["val_check_interval"], flags["check_val_every_n_epoch"]
    timed = time_interval_seconds(vci) is not None  # a time interval (checked there): validated by wall time
    if not timed and vci is not None and (isinstance(vci, bool) or not isinstance(vci, (int, float))):
        raise ValueError(f"Trainer(val_check_interval={vci!r}): give an int number of batches, a float fraction "
                         "of an epoch, or a time ('DD:HH:MM:SS', a datetime.timedelta or a dict of its arguments).")
    if not timed and isinstance(vci, float) and not 0.0 <= vci <= 1.0:
        raise ValueError(f"Trainer(val_check_interval={vci!r}): a float must be a fraction of an epoch in [0.0, 1.0] "
                         "(an int counts batches).")
    if every is None and not timed and not isinstance(vci, int):  # Lightning's message
        raise configuration_error(
            "`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
            "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`.")
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"Trainer(check_val_every_n_epoch={every!r}) must be an int >= 1 or None.")
    reload = flags["reload_dataloaders_every_n_epochs"]
    if isinstance(reload, bool) or not isinstance(reload, int) or reload < 0:
        raise configuration_error(
            f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload}.")  # Lightning's


def env_defaults(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` keyword arguments of ``cls(...)`` over the defaults read from the environment: for each
    parameter ``name`` of ``cls``, ``PL_<CLS>_<NAME>`` (``PL_TRAINER_MAX_STEPS=7``) read as a Python literal when it
    is one (``"False"`` -> False, ``"7"`` -> 7), else as the string; empty variables count as unset. Mirrors
    Lightning's ``_defaults_from_env_vars`` / ``_parse_env_variables`` (the class name is the subclass's)."""
    env: dict[str, Any] = {}
    for name in inspect.signature(cls).parameters:
        val = os.environ.get(f"PL_{cls.__name__.upper()}_{name.upper()}")
        if val is None or val == "":
            continue
        try:
            env[name] = literal_eval(val)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            env[name] = val  # not a literal: the text itself (Lightning)
    return {**env, **given}


#: barebones opt-outs: flag -> (value that counts as "not asked for" test, the part of Lightning's message)
_BAREBONES_OFF = {
    "enable_checkpointing": (lambda v: not v, "Checkpointing can impact raw speed"),
    "logger": (lambda v: v is None or v is False, "Logging can impact raw speed"),
    "enable_progress_bar": (lambda v: not v, "The progress bar can impact raw speed"),
    "log_every_n_steps": (lambda v: v is None or v == 0, "Logging can impact raw speed"),
    "enable_model_summary": (lambda v: not v, "Model summary can impact raw speed"),
    "num_sanity_val_steps": (lambda v: v is None or v == 0, "Sanity checking can impact raw speed"),
    "fast_dev_run": (lambda v: v is False or v == 0, "Development run is not meant for raw speed evaluation"),
    "detect_anomaly": (lambda v: not v, "Anomaly detection can impact raw speed"),
    "profiler": (lambda v: v is None, "Profiling can impact raw speed"),
}
_BAREBONES_INFO = (
    "You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have been disabled to "
    "facilitate analyzing the Trainer overhead. Specifically, the following features are deactivated:{sep}"
    " - Checkpointing: `Trainer(enable_checkpointing=True)`{sep} - Progress bar: `Trainer(enable_progress_bar=True)`"
    "{sep} - Model summary: `Trainer(enable_model_summary=True)`{sep} - Logging: `Trainer(logger=True)`, "
    "`Trainer(log_every_n_steps>0)`, `LightningModule.log(...)`, `LightningModule.log_dict(...)`{sep} - Sanity "
    "checking: `Trainer(num_sanity_val_steps>0)`{sep} - Development run: `Trainer(fast_dev_run=True)`{sep} - Anomaly "
    "detection: `Trainer(detect_anomaly=True)`{sep} - Profiling: `Trainer(profiler=...)`")


def apply_barebones(f: dict[str, Any]) -> None:
    """``Trainer(barebones=True)``: refuse a flag that asks for a feature barebones turns off (Lightning's
    ValueError, naming the flag and value) and set the opt-outs in ``f`` in place (no checkpointing, logger,
    progress bar, model summary, logging interval, sanity check); log Lightning's info line. No-op without it."""
    if not f["barebones"]:
        return
    for name, (off, why) in _BAREBONES_OFF.items():
        if not off(f[name]):
            raise ValueError(f"`Trainer(barebones=True, {name}={f[name]!r})` was passed. {why} so it is disabled in "
                             "barebones mode.")  # Lightning's message
    f.update(enable_checkpointing=False, logger=False, enable_progress_bar=False, log_every_n_steps=0,
             enable_model_summary=False, num_sanity_val_steps=0)
    _log.info(_BAREBONES_INFO.format(sep=os.linesep))


def time_interval_seconds(value: Any) -> float | None:
    """Seconds of a time-based ``val_check_interval`` (``"DD:HH:MM:SS"``, a ``datetime.timedelta`` or a dict of
    its keyword arguments), None for a batch count or fraction; Lightning's ``_parse_time_interval_seconds``.

    Raises:
        ValueError: a string not of four integer fields (Lightning's message; Lightning raises its
            MisconfigurationException).
    """
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return timedelta(**value).total_seconds()
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 4:
        raise ValueError(f"Invalid time format for `val_check_interval`: {value!r}. Expected 'DD:HH:MM:SS'.")
    try:
        d, h, m, s = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"Non-integer component in `val_check_interval` string: {value!r}. "
                         "Use 'DD:HH:MM:SS'.") from None
    return timedelta(days=d, hours=h, minutes=m, seconds=s).total_seconds()


@rank_zero_only
def announce_batch_limits(flags: dict[str, Any]) -> None:
    """Lightning's info line for a batch limit of exactly ``1`` or ``1.0`` (an int counts batches, a float is a
    fraction: the two read alike), in Lightning's words (``_determine_batch_limits``). Logged on global rank 0
    only, through the rank-zero gate ``Fit.__init__`` sets: call it after that."""
    for name in _LIMITS:
        value = flags[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != 1:
            continue
        if isinstance(value, int):
            what = {"limit_train_batches": "1 batch per epoch will be used.",
                    "val_check_interval": "validation will run after every batch."}.get(name, "1 batch will be used.")
            _log.info(f"`Trainer({name}=1)` was configured so {what}")
        else:
            what = {"limit_train_batches": "100% of the batches per epoch will be used.",
                    "val_check_interval": "validation will run at the end of the training epoch."}.get(
                name, "100% of the batches will be used.")
            _log.info(f"`Trainer({name}=1.0)` was configured so {what}.")  # Lightning's doubled period


def fit_options(f: dict[str, Any]) -> dict[str, Any]:
    """``FitArguments`` fields for Lightning's ``Trainer`` flags ``f`` (all of them, with Lightning's defaults);
    with ``fast_dev_run`` set, ``f``'s ``val_check_interval``/``check_val_every_n_epoch`` become 1.0/1 in place.

    Raises:
        NotImplementedError: a flag taskfit does not support (named).
    """
    if f["fast_dev_run"]:  # Lightning: validation after the one short epoch, whatever the schedule flags say
        f["val_check_interval"], f["check_val_every_n_epoch"] = 1.0, 1
    _check_batch_limits(f)
    _refuse_unsupported(f)
    max_epochs, max_steps = f["max_epochs"], f["max_steps"]
    if max_epochs is None or max_epochs == -1:  # Lightning: 1000 epochs when neither limit is given, else (and
        max_epochs = 1000 if max_steps in (None, -1) and max_epochs is None else 10 ** 9  # for -1) no epoch limit
    out = dict(output_dir=str(f["default_root_dir"] or os.getcwd()), report_to="none", save_strategy="no",
               num_train_epochs=max_epochs or 1,  # 0 trains nothing: LoopPolicy.max_epochs stops the loop
               max_steps=max_steps if max_steps not in (None, -1) else -1,
               gradient_accumulation_steps=f["accumulate_grad_batches"],
               max_grad_norm=float(f["gradient_clip_val"] or 0.0),
               gradient_clip_algorithm=f["gradient_clip_algorithm"] or "norm",
               logging_steps=f["log_every_n_steps"] or 50,  # 0 (barebones): no logging, below
               num_sanity_val_steps=0 if f["fast_dev_run"] else  # Lightning: no sanity check in fast_dev_run
               f["num_sanity_val_steps"] if f["num_sanity_val_steps"] is not None else 2,
               fast_dev_run=f["fast_dev_run"], overfit_batches=f["overfit_batches"],
               detect_anomaly=f["detect_anomaly"], disable_tqdm=f["enable_progress_bar"] is False or f["barebones"],
               eval_strategy="no")  # deterministic: Lightning's torch flags, set by the Trainer
    if f["log_every_n_steps"] == 0:
        out["logging_strategy"] = "no"
    for k in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        if f[k] is not None:
            out[k] = f[k]
    if isinstance(f["profiler"], str):
        out["profiler"] = f["profiler"]
    return out


#: Lightning's historical precision spellings (``_PRECISION_INPUT_STR_ALIAS_CONVERSION``)
_PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}


def lightning_precision(precision: Any, accelerator: Any, strategy: Any = "auto") -> tuple[Any, list[str]]:
    """Lightning's precision flag as its ``_AcceleratorConnector`` parses it: ``16``/``"16"``/``"bf16"``/``32``/
    ``64`` become ``"16-mixed"``/``"bf16-mixed"``/``"32-true"``/``"64-true"`` (the first two with Lightning's
    "supported for historical reasons" warning), and ``"16-mixed"`` on the CPU (``accelerator="cpu"``, or
    ``"auto"`` finding no other device) becomes ``"bf16-mixed"`` with Lightning's warning, since AMP with fp16 has
    no CPU kernels there (not under a DeepSpeed, FSDP or XLA strategy, whose own precision plugins Lightning
    picks first). ``Fit`` keeps fp16 autocast with a CPU ``GradScaler``; a precision plugin object (e.g.
    ``MixedPrecision("16-mixed")`` in ``plugins=``) is used as given, as in Lightning.

    Args:
        precision (str | int | Precision | None): the ``Trainer(precision=)`` flag.
        accelerator (str | Accelerator): the ``Trainer(accelerator=)`` flag; strategy (str | Strategy): the
            ``Trainer(strategy=)`` flag.

    Returns:
        tuple[Any, list[str]]: the precision to give ``Fit`` and the warnings' texts, in Lightning's order (the
        caller warns once the process's rank is known).
    """
    if isinstance(precision, bool) or not isinstance(precision, (str, int)):
        return precision, []
    name, said = str(precision), []
    if name in _PRECISION_ALIASES:
        if name[:2] not in ("32", "64"):
            said.append(f"`precision={precision}` is supported for historical reasons but its usage is discouraged. "
                        f"Please set your precision to {_PRECISION_ALIASES[name]} instead!")
        name = _PRECISION_ALIASES[name]
    acc = accelerator.strip().lower() if isinstance(accelerator, str) else None
    own_plugin = not isinstance(strategy, str) or strategy.startswith(("deepspeed", "fsdp", "xla"))
    if name == "16-mixed" and not own_plugin and acc in ("cpu", "auto") and (
            acc == "cpu" or choose_accelerator(acc)[0] == "cpu"):
        said.append("You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not "
                    "supported on CPU. Using `precision='bf16-mixed'` instead.")
        name = "bf16-mixed"
    return name, said


@rank_zero_only
def warn_precision(said: list[str]) -> None:
    """Warn (UserWarning) each text of :func:`lightning_precision`, on global rank 0 only (Lightning's
    ``rank_zero_warn``); call it after ``Fit.__init__`` set the rank-zero gate."""
    for text in said:
        warnings.warn(text, UserWarning, stacklevel=5)  # the user's Trainer(...) line


def loop_policy(f: dict[str, Any]) -> LoopPolicy:
    """The :class:`~taskfit.loops.policy.LoopPolicy` of Lightning's ``Trainer`` flags ``f`` (checked by
    :func:`fit_options` first): Lightning's loop semantics where they differ from HF's."""
    min_epochs = f["min_epochs"] if f["min_epochs"] is not None else (1 if f["min_steps"] is not None else 0)
    return LoopPolicy(counts_optimizer_steps=True, min_epochs=min_epochs, min_steps=f["min_steps"],
                      reload_dataloaders_every_n_epochs=f["reload_dataloaders_every_n_epochs"],
                      clip_algorithm_as_given=True, gradient_clip_algorithm=f["gradient_clip_algorithm"],
                      eval_prefix="", validation_closes_epoch=True, checkpoint_callbacks_last=True,
                      model_callbacks_by_subclass=True,
                      keeps_submodule_modes=True, none_optimizer_trains_nothing=True,
                      closure_in_optimizer_step=True, none_loss_skips_batch=True, plateau_steps_after_validation=True,
                      max_epochs=f["max_epochs"] if f["max_epochs"] not in (None, -1) else None,
                      lightning_checkpoint_dict=True, loaders_after_setup=True,
                      resumed_epoch_skips_start=True, zero_grad_before_validation=True,
                      eval_inference_mode=bool(f["inference_mode"]), sanity_check_keeps_rng=True,
                      logs_run_values=False, reads_eval_outputs=False, log_hooks=LOG_HOOKS,
                      metric_attribute_required=True, stop_checked_before_epoch=True, stage_argument=trainer_fn,
                      distributed_sampler="lightning" if f["use_distributed_sampler"] else "as_given")


def limit_property(name: str) -> property:
    """``Trainer.limit_*_batches`` (``name``): Lightning's parsed value of that flag: the number of batches under
    ``fast_dev_run`` (``True``: 1), else the flag (an int of batches or a float fraction), 1.0 when not given."""
    def get(trainer: Any) -> int | float:
        f = trainer._flags
        if f["fast_dev_run"]:
            return 1 if f["fast_dev_run"] is True else int(f["fast_dev_run"])
        return 1.0 if f[name] is None else f[name]
    return property(get, doc=f"``{name}``: batches (int) or fraction (float) per epoch, Lightning's parsed value "
                              "(1.0 when not given, the ``fast_dev_run`` count under it).")
