"""Lightning ``Trainer`` flags -> ``FitArguments`` fields and the loop policy, and the flags taskfit refuses (named,
before any work)."""

from __future__ import annotations

import logging
import os
from typing import Any

from lightning_utilities.core.rank_zero import rank_zero_only

from taskfit.loops.policy import LoopPolicy

_log = logging.getLogger("taskfit")
_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
           "overfit_batches", "val_check_interval")

#: Lightning flags with no taskfit equivalent: name -> the values that are accepted (anything else raises).
_UNSUPPORTED = {"use_distributed_sampler": (True,),
                "sync_batchnorm": (False,), "model_registry": (None,),
                "benchmark": (None, False)}


def _refuse_unsupported(flags: dict[str, Any]) -> None:
    """Raise NotImplementedError naming the first flag of ``flags`` outside its accepted values."""
    for name, ok in _UNSUPPORTED.items():
        if flags[name] not in ok:
            raise NotImplementedError(f"Trainer({name}={flags[name]!r}) is not supported by taskfit.lightning "
                                      f"(accepted: {ok}); see docs/lightning.md.")
    vci, every = flags["val_check_interval"], flags["check_val_every_n_epoch"]
    if vci is not None and (isinstance(vci, bool) or not isinstance(vci, (int, float))):
        raise NotImplementedError(f"Trainer(val_check_interval={vci!r}): a time interval is not supported by "
                                  "taskfit.lightning; give an int number of batches or a float fraction of an epoch.")
    if isinstance(vci, float) and not 0.0 <= vci <= 1.0:
        raise ValueError(f"Trainer(val_check_interval={vci!r}): a float must be a fraction of an epoch in [0.0, 1.0] "
                         "(an int counts batches).")
    if every is None and not isinstance(vci, int):  # Lightning's message (time durations are refused above)
        raise ValueError("`val_check_interval` should be an integer or a time-based duration (str 'DD:HH:MM:SS', "
                         "datetime.timedelta, or dict kwargs for timedelta) when `check_val_every_n_epoch=None`.")
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"Trainer(check_val_every_n_epoch={every!r}) must be an int >= 1 or None.")
    reload = flags["reload_dataloaders_every_n_epochs"]
    if isinstance(reload, bool) or not isinstance(reload, int) or reload < 0:
        raise ValueError(f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload!r}.")  # Lightning's


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
    _refuse_unsupported(f)
    max_epochs, max_steps = f["max_epochs"], f["max_steps"]
    if max_epochs is None:  # Lightning: 1000 epochs when neither limit is given, else no epoch limit
        max_epochs = 1000 if max_steps in (None, -1) else 10 ** 9
    out = dict(output_dir=str(f["default_root_dir"] or os.getcwd()), report_to="none", save_strategy="no",
               num_train_epochs=max_epochs, max_steps=max_steps if max_steps not in (None, -1) else -1,
               gradient_accumulation_steps=f["accumulate_grad_batches"],
               max_grad_norm=float(f["gradient_clip_val"] or 0.0),
               gradient_clip_algorithm=f["gradient_clip_algorithm"] or "norm",
               logging_steps=f["log_every_n_steps"] if f["log_every_n_steps"] is not None else 50,
               num_sanity_val_steps=0 if f["fast_dev_run"] else  # Lightning: no sanity check in fast_dev_run
               f["num_sanity_val_steps"] if f["num_sanity_val_steps"] is not None else 2,
               fast_dev_run=f["fast_dev_run"], overfit_batches=f["overfit_batches"],
               detect_anomaly=f["detect_anomaly"], disable_tqdm=f["enable_progress_bar"] is False or f["barebones"],
               eval_strategy="no")  # deterministic: Lightning's torch flags, set by the Trainer
    for k in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        if f[k] is not None:
            out[k] = f[k]
    if isinstance(f["profiler"], str):
        out["profiler"] = f["profiler"]
    return out


def loop_policy(f: dict[str, Any]) -> LoopPolicy:
    """The :class:`~taskfit.loops.policy.LoopPolicy` of Lightning's ``Trainer`` flags ``f`` (checked by
    :func:`fit_options` first): Lightning's loop semantics where they differ from HF's."""
    min_epochs = f["min_epochs"] if f["min_epochs"] is not None else (1 if f["min_steps"] is not None else 0)
    return LoopPolicy(counts_optimizer_steps=True, min_epochs=min_epochs, min_steps=f["min_steps"],
                      reload_dataloaders_every_n_epochs=f["reload_dataloaders_every_n_epochs"],
                      clip_algorithm_as_given=True, gradient_clip_algorithm=f["gradient_clip_algorithm"],
                      eval_prefix="", validation_closes_epoch=True, checkpoint_callbacks_last=True,
                      keeps_submodule_modes=True, none_optimizer_trains_nothing=True)
