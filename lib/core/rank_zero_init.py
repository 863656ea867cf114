"""Building a big model once: real weights on rank 0 only, the same model on the meta device (no memory) on every
other rank; the DDP, FSDP and DeepSpeed strategies then fill the other ranks from rank 0 (HF ``fsdp_config``
``cpu_ram_efficient_loading``; accelerate's and transformers' "only rank 0 loads the weights")."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator

import torch


def _rank() -> int:
    """This process's global rank before any process group exists: ``RANK`` (set by torchrun and, from their
    start, in the workers taskfit's script launcher starts), else SLURM's ``SLURM_PROCID``, else 0."""
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"The environment variable {name}={value!r} is not a process rank (an integer >= "
                                 "0).") from None
    return 0


@contextlib.contextmanager
def rank_zero_init(rank: int | None = None) -> Generator[bool, None, None]:
    """Build the model inside this block: on global rank 0 as usual, on every other rank on the meta device
    (``with torch.device("meta")``: parameters without storage, no initialisation cost). Yields whether this
    process builds the real weights, so that only rank 0 reads a weights file::

        with rank_zero_init() as real:
            model = AutoModelForCausalLM.from_pretrained(name) if real else AutoModelForCausalLM.from_config(config)

    ``strategy="fsdp"`` then shards the meta model, allocates only this rank's shards and broadcasts rank 0's
    weights into them one tensor at a time, so no other rank ever holds a whole copy (peak host memory about
    ``1 / world_size`` of the model plus its largest tensor); ``strategy="ddp"`` allocates each replica
    uninitialised and ``DistributedDataParallel``'s start-up broadcast fills it; DeepSpeed ZeRO-1/2 do the same with
    a broadcast before ``deepspeed.initialize``, and ZeRO-3 converts the model submodule by submodule with DeepSpeed's
    ``zero.Init`` (rank 0's weights broadcast, each rank keeping its partition). The same as HF's
    ``fsdp_config={"cpu_ram_efficient_loading": True}`` (where transformers' ``from_pretrained`` builds the meta
    model), and as Lightning Fabric's ``init_module(empty_init=True)`` except that rank 0 keeps real weights.
    Build optimizers over the module as usual: the strategy re-points them at the materialised parameters.

    Args:
        rank (int | None): this process's global rank; default: ``RANK`` (torchrun, taskfit's script launcher,
            whose workers see it from their start), else ``SLURM_PROCID``, else 0. ``Engine.rank_zero_init`` passes
            the engine's rank.

    Yields:
        bool: True on rank 0 (build the real model), False elsewhere (the block builds on the meta device).

    Raises:
        ValueError: ``rank`` (or ``RANK``) is not an integer >= 0. Under ``strategy="ddp_spawn"`` the model is
            built once and pickled to the workers, so this block has nothing to save there: use ``"ddp"``/``"fsdp"``
            run as a script, or torchrun.
    """
    rank = _rank() if rank is None else rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"rank_zero_init(rank=...) needs a process rank (an integer >= 0); got {rank!r}.")
    if rank == 0:
        yield True
        return
    with torch.device("meta"):
        yield False
