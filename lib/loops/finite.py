"""Stopping a run whose weights became non-finite (F-REL-5): checked on logging steps and before every save only,
so the hot path has no extra host sync; a NaN/inf anywhere in the parameters (on any rank) stops every rank with
:class:`NonFiniteError` naming the step, before a checkpoint of those weights is written."""

from __future__ import annotations

from typing import Any

import torch


class NonFiniteError(RuntimeError):
    """The model's parameters hold NaN or inf values: training cannot continue meaningfully."""


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # this rank's shard of a DTensor (FSDP)


def _values(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``module``'s named parameters that hold values: not the weights bitsandbytes packs 4-bit codes into (a
    ``Linear4bit``'s, whose module keeps a ``quant_state``), whose bits are no numbers when
    ``bnb_4bit_quant_storage`` is a float dtype (a NaN pattern among them is a valid code) and which stay frozen."""
    packed = {id(m.weight) for m in module.modules() if hasattr(m, "quant_state") and hasattr(m, "weight")}
    return [(n, p) for n, p in module.named_parameters() if id(p) not in packed]


def all_finite(module: torch.nn.Module) -> torch.Tensor:
    """A 0-dim bool tensor: every (local) parameter of ``module`` is finite (packed 4-bit weights aside). No host
    sync."""
    flags = [torch.isfinite(_local(p).detach()).all() for _, p in _values(module) if _local(p).numel()]
    return torch.stack(flags).all() if flags else torch.tensor(True)


def check_finite(strategy: Any, module: torch.nn.Module, step: int, output_dir: str | None = None,
                 action: str = "Training stopped") -> None:
    """Raise :class:`NonFiniteError` on every rank when any rank's parameters are not finite (one host sync, and a
    ``min`` reduction across ranks).

    Args:
        strategy: the run's strategy (``reduce``, ``world_size``).
        module (torch.nn.Module): the model being trained.
        step (int): the optimizer step just taken (named in the error).
        output_dir (str | None): where the run's checkpoints are; the newest complete one is named in the error.
        action (str): what is refused, the error's first words (``"Training stopped"``, ``"save_model refused"``).

    Raises:
        NonFiniteError: a parameter holds NaN or inf on some rank (every rank raises).
    """
    ok = all_finite(module)
    if strategy.world_size > 1:
        ok = strategy.reduce(ok.to(strategy.root_device, torch.float32), "min") > 0
    if bool(ok):
        return
    bad = next((n for n, p in _values(module) if not bool(torch.isfinite(_local(p).detach()).all())),
               "on another rank")
    where = f"parameter {bad!r}" if bad != "on another rank" else "a parameter on another rank"
    newest = ""
    if output_dir:
        from taskfit.io.checkpoint_format import list_checkpoints

        strategy.checkpoint_io.wait()  # a save in flight holds the weights of an earlier, finite step
        done = list_checkpoints(strategy.checkpoint_io, output_dir)
        newest = f" The newest complete checkpoint is {done[-1][1]}." if done else " No checkpoint was completed."
    raise NonFiniteError(
        f"{action} at global step {step}: {where} holds NaN or inf values (the loss or the gradients "
        "became non-finite). No checkpoint of these weights was written." + newest + " Lower learning_rate, set "
        "max_grad_norm, use bf16 instead of fp16, or check the data for NaN/inf.")
