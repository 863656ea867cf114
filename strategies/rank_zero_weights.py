"""Loading rank 0's weights into a model that the other ranks built on the meta device (HF ``fsdp_config``
``cpu_ram_efficient_loading``; :func:`taskfit.core.rank_zero_init.rank_zero_init`), shared by the DDP, FSDP and
DeepSpeed strategies, and re-pointing optimizers at the parameters a strategy put in place of the ones they were built
over.

Mirrors accelerate's FSDP2 path (``fsdp2_load_full_state_dict``) and torchtitan: shard on the meta device, allocate
the shards (``to_empty``), then ``set_model_state_dict(..., StateDictOptions(full_state_dict=True,
broadcast_from_rank0=True))``, which broadcasts one tensor at a time, so no rank but the first ever holds the whole
model. DDP keeps a full replica per rank by design: there the other ranks allocate uninitialised memory and the
``DistributedDataParallel`` constructor's broadcast from rank 0 fills it (no random initialisation, no file read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def has_meta_tensors(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (no storage)."""
    return any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def loads_from_rank_zero(module: nn.Module, device: torch.device, rank: int, world_size: int,
                         check: Callable[[str, Callable[[], Any]], Any], asked: bool = False) -> bool:
    """Whether this run fills meta-device models from rank 0's weights: ``asked`` (``cpu_ram_efficient_loading``)
    or any rank holds meta tensors. A collective (every rank calls it; one 2-element all-reduce), so every rank
    takes the same path.

    Args:
        module (nn.Module): this rank's model (real on rank 0, on the meta device on the others, or real everywhere).
        device (torch.device): this rank's device (the all-reduce's tensor lives there).
        rank (int), world_size (int): this process's global rank and the number of processes.
        check (callable): the strategy's collective guard (``ParallelStrategy.check_collective``).
        asked (bool): the strategy was told to load this way.

    Raises:
        ValueError: on every rank, when rank 0's model has meta tensors (rank 0 must hold the weights, e.g.
            ``from_pretrained`` there and the same model built on the meta device on the others).
    """
    if world_size <= 1:
        if has_meta_tensors(module):
            raise ValueError(f"{type(module).__name__} has parameters on the meta device, but this run has one "
                             "process: there is no rank 0 to load the weights from. Build the model with real weights.")
        return False
    here = has_meta_tensors(module)
    flags = torch.tensor([float(here), float(here and rank == 0)], device=device)
    check("all_reduce (meta-device model check)", lambda: dist.all_reduce(flags, op=dist.ReduceOp.MAX))
    if flags[1] > 0:
        raise ValueError(f"{type(module).__name__} has parameters on the meta device on rank 0. With meta-device "
                         "initialisation rank 0 holds the real weights and the other ranks build the model on the meta "
                         "device (see taskfit.core.rank_zero_init.rank_zero_init).")
    return asked or bool(flags[0] > 0)


def shared_parameters(module: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The parameters held by several submodules (tied weights, e.g. an output layer sharing the input
    embedding: transformers' ``tie_word_embeddings``), each as its ``(submodule, attribute name)`` owners."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for sub in module.modules():
        for name, p in sub._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((sub, name))
    return [group for group in owners.values() if len(group) > 1]


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate uninitialised storage on ``device`` for a model with meta tensors (``nn.Module.to_empty``), keeping
    tied weights tied; a no-op for a model without any (rank 0's: its weights are the ones every rank will hold).

    ``to_empty`` gives every owner of a shared meta parameter a new parameter of its own (a meta tensor cannot be
    filled in place), so the tie would be lost and the rank would hold one more parameter than rank 0; each later
    owner gets the first owner's new parameter back, as transformers' ``tie_weights`` ties them after loading."""
    if not has_meta_tensors(module):
        return
    shared = shared_parameters(module)
    module.to_empty(device=device)
    for (first, first_name), *others in shared:
        for sub, name in others:
            sub._parameters[name] = first._parameters[first_name]


def load_rank_zero_state(root: nn.Module, full_state: dict[str, torch.Tensor], rank: int,
                         check: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Load rank 0's ``full_state`` (``root.state_dict()`` taken before sharding; ``{}`` elsewhere) into the
    sharded, materialised ``root`` on every rank, one tensor broadcast at a time
    (``set_model_state_dict(..., StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))``), then
    broadcast the buffers a state dict leaves out (non-persistent ones, e.g. rotary ``inv_freq``). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    check("broadcast (rank 0's weights)",
          lambda: set_model_state_dict(root, full_state if rank == 0 else {}, options=options))
    saved = set(root.state_dict().keys())
    with torch.no_grad():
        for name, buffer in root.named_buffers():
            if name not in saved:
                check("broadcast (non-persistent buffers)", lambda b=buffer: dist.broadcast(b, src=0))


def broadcast_in_place(module: nn.Module, check: Callable[[str, Callable[[], Any]], Any]) -> None:
    """Broadcast rank 0's parameters and buffers into every rank's own tensors of the unsharded ``module``, one
    tensor at a time and in place (no second copy on any rank; a shared parameter once): what
    ``DistributedDataParallel``'s start-up and FSDP's ``sync_module_states`` do. A collective."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            check("broadcast (rank 0's weights)", lambda t=t: dist.broadcast(t.data, src=0))


def repoint_optimizers(module: nn.Module, optimizers: list[Any], names_before: dict[int, str]) -> list[Any]:
    """Replace the parameters ``optimizers`` were built over by the ones now in ``module`` under the same names
    (sharding and ``to_empty`` put new parameter objects in place); optimizer state, if any, moves with them.
    ``names_before`` maps ``id(old parameter)`` to its name. Returns ``optimizers``.

    Raises:
        ValueError: an optimizer holds a parameter that is not one of ``module``'s.
    """
    now = dict(module.named_parameters())
    current = {id(p) for p in now.values()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            new = []
            for p in group["params"]:
                if id(p) in current:
                    new.append(p)
                    continue
                name = names_before.get(id(p))
                if name is None or name not in now:
                    raise ValueError(f"An optimizer holds a parameter of shape {tuple(p.shape)} that is not a "
                                     "parameter of the module the strategy wraps; build optimizers over the module's "
                                     "own parameters.")
                if p in optimizer.state:
                    optimizer.state[now[name]] = optimizer.state.pop(p)
                new.append(now[name])
            group["params"] = new
    return optimizers
