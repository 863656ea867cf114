"""A memory estimate before training (F-MEM-5): ``taskfit.estimate_memory`` and ``taskfit estimate``.

Bytes per device for the model's parameters, their gradients, the optimizer state, the half-precision weight
copies autocast makes, and the activations saved for backward by one traced micro-batch, for the precision,
optimizer and strategy named by ``FitArguments``. The rules follow the "anatomy of model memory" section of the
efficiency guide (AdamW 8 bytes per parameter, Adafactor ~4 plus factored statistics, 8-bit Adam ~2, SGD with
momentum 4) but are computed exactly per parameter tensor for the optimizers taskfit builds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from taskfit.core.hooks import module_modes
from taskfit.optim.optimizers import BNB_OPTIMIZERS, parse_optim_args
from taskfit.registry import invalid_choice

_BNB_MIN_8BIT_SIZE, _BNB_BLOCKSIZE, _BNB_QMAP_BYTES = 4096, 256, 256 * 4
#: modules whose weights autocast casts to 16 bits in every forward (the "precision copies")
_AUTOCAST_LAYERS = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.RNNBase, nn.MultiheadAttention)
#: strategy name prefix -> which of (parameters, gradients, optimizer state) are sharded over the world size
_SHARDING = {
    "deepspeed_stage_3": (True, True, True), "fsdp": (True, True, True), "deepspeed_stage_2": (False, True, True),
    "deepspeed_stage_1": (False, False, True), "deepspeed": (False, True, True),
}


@dataclass
class MemoryEstimate:
    """Estimated device memory of one training process, in bytes.

    Attributes:
        parameters (int): weights held on the device (after the precision plugin's conversion).
        gradients (int): one gradient per trainable parameter, in the parameter's dtype.
        optimizer_state (int): optimizer buffers (0 on the device when a ``*_offload`` strategy moves them to CPU).
        precision_copies (int): 16-bit weight copies autocast makes per forward (mixed precision only).
        activations (int | None): tensors saved for backward by one micro-batch (None without a batch).
        precision, optimizer, strategy (str): what the estimate is for; world_size (int): processes sharing shards.
        offloaded_optimizer_state (int): optimizer bytes kept in host memory instead (``*_offload`` strategies).
    """

    parameters: int
    gradients: int
    optimizer_state: int
    precision_copies: int
    activations: int | None
    precision: str
    optimizer: str
    strategy: str = "single_device"
    world_size: int = 1
    num_parameters: int = 0
    trainable_parameters: int = 0
    offloaded_optimizer_state: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Sum of the device components (bytes)."""
        return (self.parameters + self.gradients + self.optimizer_state + self.precision_copies
                + (self.activations or 0))

    def to_dict(self) -> dict[str, Any]:
        """All fields plus ``total`` (bytes), JSON-ready."""
        return {**asdict(self), "total": self.total}

    def table(self) -> str:
        """A small human-readable table (MiB with two decimals)."""
        rows = [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer state", self.optimizer_state), ("precision copies", self.precision_copies),
                ("activations (1 micro-batch)", self.activations), ("total per device", self.total)]
        head = (f"memory estimate: precision={self.precision} optim={self.optimizer} strategy={self.strategy} "
                f"world_size={self.world_size} params={self.num_parameters:,} "
                f"(trainable {self.trainable_parameters:,})")
        lines = [head] + [f"  {name:<28} {'n/a' if b is None else f'{b / 2**20:12.2f} MiB'}" for name, b in rows]
        if self.offloaded_optimizer_state:
            lines.append(f"  {'optimizer state on host':<28} {self.offloaded_optimizer_state / 2**20:12.2f} MiB")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def optimizer_state_bytes(name: str, param: torch.Tensor, optim_args: dict[str, Any] | None = None) -> int:
    """Exact bytes of the state tensors ``optim=name`` keeps for one parameter tensor ``param``.

    Matches what the optimizers taskfit builds allocate (summing ``t.nbytes`` over ``optimizer.state[param]``):
    AdamW ``exp_avg`` + ``exp_avg_sq`` (+ ``max_exp_avg_sq`` with ``amsgrad``) in the parameter dtype plus a
    4-byte ``step``; SGD a ``momentum_buffer`` only when ``momentum`` != 0; Adagrad ``sum`` + ``step``; RMSprop
    ``square_avg`` + ``step`` (+ ``momentum_buffer``, + ``grad_avg`` when centered); Adafactor ``step`` + row and
    column statistics for tensors of 2+ dimensions (a full ``variance`` for 1-D); lion-pytorch ``exp_avg``;
    bitsandbytes 8-bit: 1 byte per element per state plus 4-byte absmax per 256-element block and a 1 KiB qmap
    per state, for tensors of >= 4096 elements (smaller ones and 32-bit variants: float32 states).

    Raises:
        ValueError: an optimizer name without a rule (lists the known ones).
    """
    optim_args = optim_args or {}
    n, es = param.numel(), param.element_size()
    if name in ("adamw_torch", "adamw_torch_fused"):
        return (3 if optim_args.get("amsgrad") else 2) * n * es + 4
    if name == "sgd":
        return n * es if optim_args.get("momentum", 0) else 0
    if name == "adagrad":
        return n * es + 4
    if name == "rmsprop":
        return n * es * (1 + bool(optim_args.get("momentum", 0)) + bool(optim_args.get("centered"))) + 4
    if name == "adafactor":
        if param.dim() > 1:
            return (n // param.shape[-1] + n // param.shape[-2]) * es + 4
        return n * es + 4
    if name == "lion":
        return n * es
    if name in BNB_OPTIMIZERS:
        states = 3 if "ademamix" in name else 2 if "adam" in name else 1  # AdEMAMix: two first moments
        if "8bit" in name and n >= _BNB_MIN_8BIT_SIZE:
            qmaps = 1 + ("adam" in name or "ademamix" in name)
            return states * (n + 4 * math.ceil(n / _BNB_BLOCKSIZE)) + qmaps * _BNB_QMAP_BYTES
        return states * n * 4
    raise invalid_choice("optimizer for the memory estimate", name,
                         ("adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor", "lion",
                          *BNB_OPTIMIZERS))


def _saved_activation_bytes(module: nn.Module, batch: Any, precision: Any, device: torch.device) -> int:
    """Bytes of the distinct storages autograd saves for backward in one training forward of ``batch``."""
    from taskfit.core.module import TaskModule, infer_batch_size
    from taskfit.core.results import ResultCollection
    from taskfit.core.wrapping import extract_loss, run_model

    param_ptrs = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs and t.device.type != "meta":
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    restore_modes, results = module_modes(module), getattr(module, "_results", None)
    is_task = isinstance(module, TaskModule)
    if is_task and results is None:
        module._results = ResultCollection(infer_batch_size, lambda t, *a, **k: t)
    module.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision.forward_context(device.type):
            out = module.training_step(batch, 0) if is_task else extract_loss(run_model(module, batch))
        del out
    finally:
        restore_modes()  # each submodule's own mode (a frozen one stays in eval)
        if is_task:
            module._results = results
    return sum(seen.values())


def _world_size(args: Any) -> int:
    devices = getattr(args, "devices", 1)
    if isinstance(devices, list):
        return max(1, len(devices))
    return devices if isinstance(devices, int) and devices > 0 else 1


def estimate_memory(module: nn.Module, args: Any = None, batch: Any = None, *, world_size: int | None = None
                    ) -> MemoryEstimate:
    """Estimate the device memory a training run of ``module`` with ``args`` needs (F-MEM-5).

    Mirrors the arithmetic of the efficiency guide's optimizer section (and Accelerate's ``estimate-memory``), made
    exact per tensor: see :func:`optimizer_state_bytes`. Parameters take the dtype of the precision plugin
    (``64-true``: 8 bytes, ``bf16-true``/``16-true``: 2, else their own dtype); ``16-mixed``/``bf16-mixed`` add 2
    bytes per weight of autocast-cast layers (Linear, Conv, RNN, attention). Sharding strategies divide what they
    shard by the world size (``fsdp``/``deepspeed_stage_3``: all three; ``deepspeed_stage_2``: gradients and
    optimizer state; ``deepspeed_stage_1``: optimizer state); ``*_offload`` moves the optimizer state to the host.
    Activations come from one real forward of ``batch`` (a training_step for TaskModules, ``model(**batch)`` for
    plain models) under the precision's autocast, counting the distinct tensors autograd saves for backward.
    Nothing in ``module`` changes (no dtype cast, no optimizer is built).

    Args:
        module (nn.Module): a TaskModule or a plain model.
        args (FitArguments | dict | None): ``optim``, ``optim_args``, ``precision``/``fp16``/``bf16``, ``strategy``,
            ``devices`` are read; None = defaults (adamw_torch, 32-true, single device).
        batch (Any): one micro-batch on the module's device, or None to skip the activation estimate.
        world_size (int | None): processes sharing the sharded state; default from ``args.devices``.

    Returns:
        MemoryEstimate: bytes per component and ``total``.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``.
        ValueError: bad arguments (as ``FitArguments``), or an optimizer without an estimate rule.
    """
    from taskfit.arguments.fit_arguments import FitArguments
    from taskfit.precision import PRECISIONS

    if not isinstance(module, nn.Module):
        raise TypeError(f"estimate_memory expects an nn.Module, got {type(module).__name__}.")
    if args is None:
        args = FitArguments()
    elif isinstance(args, dict):
        args = FitArguments.from_dict(dict(args))
    precision_name = args.resolved_precision()
    optim = getattr(args.optim, "value", args.optim)
    optim_args = parse_optim_args(args.optim_args)
    plugin = PRECISIONS.build(precision_name)  # the name is parsed once; the plugin says what it casts
    true_dtype = plugin.param_dtype
    world = world_size if world_size is not None else _world_size(args)
    strategy = str(args.strategy)
    shard = next((v for k, v in _SHARDING.items() if strategy.startswith(k)), (False, False, False))

    params = grads = state = copies = n_all = n_train = 0
    seen: set[int] = set()
    for p in module.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        view = torch.empty(0, dtype=true_dtype).new_empty(p.shape, device="meta") if true_dtype else p.detach()
        nbytes = p.numel() * view.element_size()
        n_all += p.numel()
        params += nbytes
        if p.requires_grad:
            n_train += p.numel()
            grads += nbytes
            state += optimizer_state_bytes(optim, view, optim_args)
    if plugin.autocast_dtype is not None:
        copies = sum(p.numel() * 2 for m in module.modules() if isinstance(m, _AUTOCAST_LAYERS)
                     for p in m.parameters(recurse=False) if p.is_floating_point())
    params, grads, state = (math.ceil(v / world) if s else v for v, s in zip((params, grads, state), shard))
    offloaded = 0
    if strategy.endswith("_offload"):
        offloaded, state = state, 0
    activations = None
    if batch is not None:
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        activations = _saved_activation_bytes(module, batch, plugin if plugin.autocast_dtype is not None
                                              else PRECISIONS.build("32-true"), device)
    notes = []
    if true_dtype is not None and batch is not None:
        notes.append(f"activations traced in the module's current dtype; {precision_name} stores them in "
                     f"{str(true_dtype).removeprefix('torch.')}")
    return MemoryEstimate(params, grads, state, copies, activations, precision_name, optim, strategy, world,
                          n_all, n_train, offloaded, notes)
