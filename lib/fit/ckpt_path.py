"""Which checkpoint ``fit.validate/test/predict(..., ckpt_path=...)`` scores: ``"best"``, ``"last"`` or a path
(mirrors Lightning's ``ckpt_path`` argument of ``Trainer.validate/test/predict``)."""

from __future__ import annotations

import json
from typing import Any


def resolve_ckpt_path(value: str, output_dir: str, io: Any, callbacks: Any = (), best_model_checkpoint: str | None
                      = None) -> str:
    """The checkpoint folder that ``ckpt_path=value`` names.

    Args:
        value (str): ``"best"``: a ``ModelCheckpoint`` callback's ``best_model_path``, else the run's
            ``best_model_checkpoint`` (``metric_for_best_model``), else the one recorded in the newest checkpoint
            of ``output_dir``; ``"last"``: a ``ModelCheckpoint``'s ``last_model_path``, else the newest complete
            checkpoint in ``output_dir``; anything else: a checkpoint folder path or URL.
        output_dir (str): the run's ``output_dir``.
        io (CheckpointIO): the storage the checkpoints live on.
        callbacks (Sequence): the Fit's callbacks (``ModelCheckpoint`` objects are asked first).
        best_model_checkpoint (str | None): the last fit's best checkpoint, if any.

    Raises:
        ValueError: nothing found for ``"best"``/``"last"``, or a path that is not a complete checkpoint (names
            what was looked at).
    """
    from taskfit.callbacks.model_checkpoint import ModelCheckpoint
    from taskfit.checkpoint.writer import CheckpointError, list_checkpoints, read_manifest
    from taskfit.io.checkpoint_io import join

    if not isinstance(value, str) or not value:
        raise ValueError(f"ckpt_path={value!r} is not valid: give 'best', 'last' or a checkpoint folder path.")
    mcs = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    if value in ("best", "last"):
        attr = "best_model_path" if value == "best" else "last_model_path"
        found = [getattr(cb, attr) for cb in mcs if getattr(cb, attr)]
        if value == "last" and not found:  # save_last off: the newest kept one
            found = [cb.best_model_path for cb in mcs if cb.monitor is None and cb.best_model_path]
        if found:
            return found[0]
        if value == "best" and best_model_checkpoint:
            return best_model_checkpoint
        done = list_checkpoints(io, output_dir) if io.exists(output_dir) else []
        if not done:
            raise ValueError(f"ckpt_path={value!r}: no ModelCheckpoint recorded one and there is no complete "
                             f"checkpoint in output_dir {output_dir!r}.")
        path = done[-1][1]
        if value == "best":
            best = json.loads(io.read_bytes(join(path, "trainer_state.json"))).get("best_model_checkpoint")
            if not best:
                raise ValueError(f"ckpt_path='best': no ModelCheckpoint with a monitor, and {path} records no best "
                                 "checkpoint (set metric_for_best_model when training); use 'last' or a path.")
            path = best
        return path
    try:
        read_manifest(io, value)
    except (CheckpointError, FileNotFoundError, OSError) as err:
        raise ValueError(f"ckpt_path={value!r} is not a complete checkpoint: {err}") from err
    return value


def load_ckpt_path(fit: Any, run: Any, ckpt_path: str) -> str:
    """Resolve ``ckpt_path`` for ``fit`` and load those weights into ``run.model`` (set up on its strategy).
    Returns the folder loaded.

    Raises:
        ValueError: as :func:`resolve_ckpt_path`. CheckpointError: weights that do not match the model.
    """
    path = resolve_ckpt_path(ckpt_path, fit.args.output_dir, fit.strategy.checkpoint_io, fit.callbacks,
                             run.state.best_model_checkpoint)
    fit.strategy.load_checkpoint(path, run.model)
    return path
