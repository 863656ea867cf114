"""The dict that ``on_save_checkpoint(checkpoint)`` / ``on_load_checkpoint(checkpoint)`` receive (module,
datamodule, callbacks). ``Fit`` hands them the run's training-state dict (what ``training_state.pt`` holds) with
Lightning's ``epoch``, ``global_step`` and ``lr_schedulers`` added for reading; the Lightning door hands them a dict
of Lightning's shape (``Trainer.save_checkpoint``'s ``dump_checkpoint``). Keys a hook adds to that dict are kept in
the checkpoint folder (inside ``training_state.pt``, read back with ``torch.load(weights_only=True)``: tensors,
numbers, strings and containers of them) and given back at load. The folder format itself does not change."""

from __future__ import annotations

import functools
from typing import Any

#: where the Lightning-shaped dict's own values (``epoch``, ``global_step``) and the keys hooks added are kept in
#: the training-state dict
HOOK_KEYS = "hook_checkpoint"
#: the keys of Lightning's checkpoint dict that taskfit fills from its own files (never stored twice)
_BUILT = ("epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks",
          "optimizer_states", "lr_schedulers", "hyper_parameters", "hparams_name")


@functools.lru_cache(maxsize=1)
def lightning_version() -> str:
    """The ``pytorch-lightning_version`` a Lightning-shaped dict carries: the installed ``lightning`` (or
    ``pytorch-lightning``) package's version, else the 2.6 release the door mirrors."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("lightning", "pytorch-lightning"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "2.6.6"


def lightning_dict(run: Any, precision: Any, training_state: dict[str, Any], epoch: int,
                   global_step: int) -> dict[str, Any]:
    """A checkpoint dict of Lightning's shape for the run's hooks (mirrors Lightning's
    ``_CheckpointConnector.dump_checkpoint`` with ``weights_only=False``).

    Args:
        run (RunView): the run (``module``, ``optimizers``, ``schedulers``).
        precision (Precision): the strategy's precision plugin (its state under its class's name when not empty).
        training_state (dict): the run's training-state dict (its ``callbacks`` part is reused: no callback's
            ``state_dict`` is called twice).
        epoch (int): ``trainer.current_epoch`` at the save. global_step (int): optimizer steps taken.

    Returns:
        dict: ``epoch``, ``global_step``, ``pytorch-lightning_version``, ``state_dict`` (the module's, tensors
        shared, not copied), ``loops`` (empty: taskfit's loop state is in its own files), ``callbacks``
        (``{state_key: state}``), ``optimizer_states``, ``lr_schedulers`` (state dicts, in order), the precision
        plugin's state when it has one, ``hyper_parameters`` (and ``hparams_name``) when the module saved some.
    """
    module = run.module
    out: dict[str, Any] = {
        "epoch": int(epoch), "global_step": int(global_step), "pytorch-lightning_version": lightning_version(),
        "state_dict": module.state_dict(), "loops": {}, "callbacks": training_state.get("callbacks", {}),
        "optimizer_states": [o.state_dict() for o in run.optimizers or ()],
        "lr_schedulers": [c.scheduler.state_dict() for c in run.schedulers or ()]}
    prec = training_state.get("precision")
    if prec:
        out[type(precision).__qualname__] = prec
    hparams = vars(module).get("_hparams")
    if hparams:
        if "_hparams_name" in vars(module):
            out["hparams_name"] = vars(module)["_hparams_name"]
        out["hyper_parameters"] = dict(hparams)
    return out


def keep_added_keys(training_state: dict[str, Any], before: set[str], hook_dict: dict[str, Any]) -> None:
    """Store in ``training_state`` (under :data:`HOOK_KEYS`) the ``epoch``/``global_step`` of ``hook_dict`` and
    the keys the hooks added to it (not in ``before``), so the checkpoint folder keeps them."""
    added = {k: v for k, v in hook_dict.items() if k not in before and k not in _BUILT}
    training_state[HOOK_KEYS] = {"epoch": hook_dict.get("epoch"), "global_step": hook_dict.get("global_step"),
                                 "added": added}


def loaded_lightning_dict(run: Any, precision: Any, training_state: dict[str, Any]) -> dict[str, Any]:
    """The Lightning-shaped dict ``on_load_checkpoint`` receives for a checkpoint restored into ``run``: what
    :func:`lightning_dict` gave the hooks when it was saved (weights, optimizer and scheduler states as restored,
    the saved ``epoch``/``global_step``), with the keys the save hooks added given back."""
    kept = training_state.get(HOOK_KEYS) or {}
    state = training_state.get("state") or {}
    epoch = kept.get("epoch", state.get("current_epoch", 0))
    step = kept.get("global_step", state.get("global_step", 0))
    out = lightning_dict(run, precision, training_state, epoch if epoch is not None else 0, step or 0)
    out.update(kept.get("added") or {})
    return out
