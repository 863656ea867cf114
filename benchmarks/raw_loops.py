"""The strategies suite's raw counterparts: the same job as a taskfit strategy row, written by hand in plain
PyTorch / DeepSpeed, so ``taskfit / raw`` says what taskfit's strategy costs on top of the library it drives.

Every loop trains ``net`` (a ``torch.nn.Module`` mapping float32 ``(batch, features)`` inputs to logits) with
cross-entropy on the batches of a ``DistributedSampler`` (shuffled with ``seed``, as taskfit's training loader),
AdamW with the ``FitArguments`` defaults (lr 5e-5, betas (0.9, 0.999), eps 1e-8, weight decay 0) over two parameter
groups (matrices / biases, as taskfit and the HF Trainer group them), a constant
learning rate, no gradient clipping, fp32, ``zero_grad(set_to_none=True)``; and records
``time.perf_counter()`` after every optimizer step into ``clock`` (the same instants at which taskfit's
``on_step_end`` fires). The process group (gloo on CPU) must already be initialised when ``world > 1`` or the
kind is not ``single_device``.

Kinds (``RAW_KINDS``): ``single_device`` (the plain loop), ``ddp`` (``DistributedDataParallel``), ``fsdp``
(FSDP2 ``fully_shard`` of the root on a 1-D mesh, a ``(world, 1)`` mesh for ``no_shard`` or a ``(1, world)``
mesh for ``hybrid_shard``, ``CPUOffloadPolicy`` for ``offload``; as taskfit's FSDP strategy does for a model
without wrap units), ``deepspeed`` (``deepspeed.initialize`` with a ZeRO config: the torch AdamW object as the
client optimizer, or for optimizer offload DeepSpeed's own ``AdamW`` section), ``tensor_parallel``
(``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` plans on a 1-D mesh: every rank sees the
same batches).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

#: kind -> what the hand-written loop is
RAW_KINDS: dict[str, str] = {
    "single_device": "plain PyTorch loop",
    "ddp": "hand-written DistributedDataParallel loop",
    "fsdp": "hand-written FSDP2 fully_shard loop",
    "deepspeed": "bare deepspeed.initialize engine loop",
    "tensor_parallel": "bare DTensor tensor-parallel loop (parallelize_module)",
}
LR, BETAS, EPS, WEIGHT_DECAY = 5e-5, (0.9, 0.999), 1e-8, 0.0


def param_groups(net: torch.nn.Module) -> list[dict[str, Any]]:
    """Two parameter groups, as nanoGPT's ``configure_optimizers`` and the HF Trainer build them: weight decay on
    the matrices, none on biases (for these MLPs the same split as taskfit's ``get_decay_parameter_names``)."""
    params = [p for p in net.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def adamw(net: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW with the ``FitArguments`` defaults over :func:`param_groups`."""
    return torch.optim.AdamW(param_groups(net), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)


def tp_plan(net: torch.nn.Sequential) -> dict[str, Any]:
    """The tensor-parallel plan of a ReLU MLP ``Sequential`` (Linear, ReLU, Linear, ReLU, ..., Linear): pairs of
    ``ColwiseParallel`` / ``RowwiseParallel`` layers (one all-reduce per pair), and an odd last layer
    ``ColwiseParallel`` gathered back to a replicated output, so every parameter is a ``DTensor``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    linears = [name for name, m in net.named_children() if isinstance(m, torch.nn.Linear)]
    plan: dict[str, Any] = {}
    for i, name in enumerate(linears):
        if i % 2 == 0:
            last = i == len(linears) - 1
            plan[name] = ColwiseParallel(output_layouts=Replicate()) if last else ColwiseParallel()
        else:
            plan[name] = RowwiseParallel()
    return plan


def loader(dataset: Any, batch: int, rank: int, world: int, seed: int = 0) -> Any:
    """The training loader: ``DistributedSampler(shuffle=True, seed=seed)`` over ``world`` replicas."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch, sampler=sampler)


def epochs(batches: Any, steps: int) -> Iterator[Any]:
    """The first ``steps`` batches of ``batches`` over as many epochs as that takes, the sampler reseeded with the
    epoch number at the start of each (as taskfit's training loader); no batch is drawn beyond the last step."""
    done, epoch = 0, 0
    while done < steps:
        batches.sampler.set_epoch(epoch)
        for batch in batches:
            yield batch
            done += 1
            if done == steps:
                return
        epoch += 1


def stamp(clock: list[float], cpu_clock: list[float]) -> None:
    """Record the wall-clock and CPU instants of an optimizer step's end (where taskfit's ``on_step_end`` fires)."""
    clock.append(time.perf_counter())
    cpu_clock.append(time.process_time())


def train_raw(kind: str, options: dict[str, Any], net: torch.nn.Module, dataset: Any, *, batch: int, steps: int,
              rank: int = 0, world: int = 1, clock: list[float] | None = None,
              cpu_clock: list[float] | None = None) -> torch.nn.Module:
    """Train ``net`` for ``steps`` optimizer steps with the hand-written loop of ``kind``; returns the trained
    module (for ``fsdp`` / ``tensor_parallel`` its parameters are DTensors; for ``deepspeed`` the engine's
    module).

    Args:
        kind (str): one of :data:`RAW_KINDS`.
        options (dict): ``fsdp``: ``sharding`` (``full_shard`` | ``shard_grad_op`` | ``no_shard`` |
            ``hybrid_shard``), ``offload`` (bool); ``deepspeed``: ``stage`` (0-3), ``offload_optimizer`` /
            ``offload_param`` (bool).
        batch (int): samples per process per step. rank, world (int): this process and the number of
            data-parallel replicas (``tensor_parallel``: the tensor-parallel size; the data is not split).
        clock (list[float] | None): receives ``time.perf_counter()`` after every optimizer step.
        cpu_clock (list[float] | None): receives ``time.process_time()`` (CPU seconds) at the same points.

    Raises:
        ValueError: an unknown kind (names the valid ones).
    """
    if kind not in RAW_KINDS:
        raise ValueError(f"unknown raw loop kind {kind!r}; valid: {', '.join(RAW_KINDS)}")
    clock = clock if clock is not None else []
    cpu_clock = cpu_clock if cpu_clock is not None else []
    data_world, data_rank = (1, 0) if kind == "tensor_parallel" else (world, rank)
    batches = loader(dataset, batch, data_rank, data_world)
    if kind == "deepspeed":  # the engine owns the optimizer: its backward and step (which also zeroes gradients)
        engine = _deepspeed_engine(options, net, batch)
        engine.train()
        for x, y in epochs(batches, steps):
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            stamp(clock, cpu_clock)
        return engine.module
    model = _wrap(kind, options, net, world)
    opt = adamw(model)
    model.train()
    for x, y in epochs(batches, steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stamp(clock, cpu_clock)
    return model.module if kind == "ddp" else model


def _wrap(kind: str, options: dict[str, Any], net: torch.nn.Module, world: int) -> torch.nn.Module:
    """``net`` as the plain-PyTorch kinds train it: itself, in ``DistributedDataParallel``, ``fully_shard``-ed, or
    parallelised with :func:`tp_plan` on a ``(world,)`` mesh."""
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(net)
    if kind == "fsdp":
        return _fully_shard(net, options, world)
    if kind == "tensor_parallel":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        return parallelize_module(net, init_device_mesh("cpu", (world,)), tp_plan(net))
    return net


def _fully_shard(net: torch.nn.Module, options: dict[str, Any], world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    sharding = options.get("sharding", "full_shard")
    if sharding in ("full_shard", "shard_grad_op"):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:  # no_shard replicates on (world, 1); hybrid_shard on one node shards on (1, world)
        shape = (world, 1) if sharding == "no_shard" else (1, world)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    offload = CPUOffloadPolicy(pin_memory=False) if options.get("offload") else OffloadPolicy()
    fully_shard(net, mesh=mesh, reshard_after_forward=sharding in ("full_shard", "hybrid_shard"),
                offload_policy=offload)
    return net


def deepspeed_config(options: dict[str, Any], batch: int) -> dict[str, Any]:
    """The ZeRO config of the raw DeepSpeed loop (what ``deepspeed_stage_N[_offload]`` resolves to for this job)."""
    zero: dict[str, Any] = {"stage": int(options.get("stage", 0))}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
        "steps_per_print": 10**9, "wall_clock_breakdown": False, "zero_optimization": zero,
    }
    if options.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                         "weight_decay": WEIGHT_DECAY}}
    if options.get("offload_param"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return cfg


def _deepspeed_engine(options: dict[str, Any], net: torch.nn.Module, batch: int) -> Any:
    """``deepspeed.initialize`` of ``net`` with :func:`deepspeed_config`: the torch AdamW as the client optimizer,
    or the config's own optimizer section when it has one (optimizer offload)."""
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    cfg = deepspeed_config(options, batch)
    if "optimizer" in cfg:
        engine, *_ = deepspeed.initialize(model=net, model_parameters=param_groups(net), config=cfg)
    else:
        engine, *_ = deepspeed.initialize(model=net, optimizer=adamw(net), config=cfg)
    return engine
