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
        (``{state_key: state}`` of the callbacks whose state is not empty), ``optimizer_states``, ``lr_schedulers`` (state dicts, in order), the precision
        plugin's state when it has one, ``hyper_parameters`` (and ``hparams_name``) when the module saved some.
    """
    module = run.module
    out: dict[str, Any] = {
        "epoch": int(epoch), "global_step": int(global_step), "pytorch-lightning_version": lightning_version(),
        "state_dict": module.state_dict(), "loops": {},  # Lightning keeps only the callbacks whose state is not empty
        "callbacks": {k: v for k, v in (training_state.get("callbacks") or {}).items() if v},
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


def saved_epoch(training_state: dict[str, Any]) -> int:
    """The ``epoch`` of the Lightning-shaped dict a checkpoint was saved with (its training state dict)."""
    epoch = (training_state.get(HOOK_KEYS) or {}).get("epoch", (training_state.get("state") or {}).get(
        "current_epoch", 0))
    return epoch if epoch is not None else 0


def loaded_lightning_dict(run: Any, precision: Any, training_state: dict[str, Any]) -> dict[str, Any]:
    """The Lightning-shaped dict ``on_load_checkpoint`` receives for a checkpoint restored into ``run``: what
    :func:`lightning_dict` gave the hooks when it was saved (weights, optimizer and scheduler states as restored,
    the saved ``epoch``/``global_step``), with the keys the save hooks added given back."""
    kept = training_state.get(HOOK_KEYS) or {}
    state = training_state.get("state") or {}
    step = kept.get("global_step", state.get("global_step", 0))
    out = lightning_dict(run, precision, training_state, saved_epoch(training_state), step or 0)
    out.update(kept.get("added") or {})
    return out


def restore_modules_and_callbacks(run: Any, path: str, strategy: Any, callbacks: list[Any], hooks: Any, owner: Any,
                                  restore_hf_callbacks: bool, weights_only: bool = True) -> None:
    """Lightning's first restore step (``_restore_modules_and_callbacks``, before ``configure_optimizers``): the
    model weights of checkpoint ``path`` loaded into ``run.model``, then ``on_load_checkpoint(checkpoint)`` (the
    module first, then the callbacks; datamodule state through its callback) with a Lightning-shaped dict read
    from the folder, then each callback's ``load_state_dict``. The rest (optimizers, schedulers, loop state) is
    restored later by :func:`taskfit.checkpoint.resume.restore` with ``callbacks_restored=True``.

    Args:
        run (RunView): the run (its ``module`` set up by ``configure_model``, no optimizers yet).
        path (str): the checkpoint folder. strategy (Strategy): its ``checkpoint_io``, ``precision`` and
            ``load_checkpoint``. callbacks (list): the callbacks restored. hooks (HookRunner): calls the hooks.
        owner (Any): the trainer the callbacks' hooks receive.
        restore_hf_callbacks (bool): also restore HF callbacks (``restore_callback_states_from_checkpoint``).
        weights_only (bool): read the files with ``torch.load(weights_only=...)``.

    Raises:
        CheckpointError: a missing or corrupted file. UnsafeCheckpointError: a file needs full unpickling.
    """
    from taskfit.checkpoint.resume import read_checkpoint
    from taskfit.loops.state import restore_callbacks, upgrade_training_state
    from taskfit.strategies.checkpointing import open_checkpoint, optimizer_file

    files = read_checkpoint(strategy, path, run.model, weights_only=weights_only, full=False)["manifest"]["files"]
    reader = open_checkpoint(strategy.checkpoint_io, path, weights_only=weights_only)
    ts = upgrade_training_state(reader.read("training_state.pt"))
    checkpoint = loaded_lightning_dict(run, strategy.precision, ts)
    # the optimizer and scheduler states as saved (full files; a sharded optimizer state is left out)
    names = [optimizer_file(i) for i in range(len(files))]
    checkpoint["optimizer_states"] = [reader.read(n) for n in names if n in files]
    names = ["scheduler.pt"] + [f"scheduler_{i}.pt" for i in range(1, len(files))]
    checkpoint["lr_schedulers"] = [reader.read(n) for n in names if n in files]
    listeners = hooks.lightning["on_load_checkpoint"]  # Lightning: the module's hook first, then the callbacks'
    for fn, is_callback in sorted(listeners, key=lambda item: item[1]):
        if is_callback:
            fn(owner, run.module, checkpoint)
        else:
            fn(checkpoint)
    state = ts.get("state") or {}
    restore_callbacks(callbacks, ts.get("callbacks", {}), restore_hf_callbacks, state.get("stateful_callbacks"))
