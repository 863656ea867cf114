"""The settings each strategy family reads, as small typed objects. The connector
(:func:`taskfit.connector.strategy_settings`) resolves them from the run's options once per run and hands them to
:meth:`Strategy.apply_settings`; strategies never read the options object themselves. Mirrors how Lightning's
strategies take their options as constructor arguments instead of reading the Trainer's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from taskfit.strategies.fsdp_options import FSDPOptions

#: ``ddp_timeout`` when none is given (seconds; torch.distributed's and HF's default)
DEFAULT_TIMEOUT_S = 1800.0


def no_warmup(max_steps: int) -> int:
    """No warmup steps (a module-level function: settings travel pickled into spawned workers)."""
    return 0


@dataclass(frozen=True)
class StrategySettings:
    """Settings of a one-process strategy: none today (the base of every family's settings)."""


@dataclass(frozen=True)
class ProcessGroupSettings(StrategySettings):
    """The process group of a multi-process strategy.

    Attributes:
        backend (str | None): ``ddp_backend`` (``"gloo"``, ``"nccl"``, ...); None: ``nccl`` on CUDA, else ``gloo``.
        timeout (float | None): ``ddp_timeout`` as given (seconds); None: :data:`DEFAULT_TIMEOUT_S`. Kept as given
            so that error messages name the option's own value.
    """

    backend: str | None = None
    timeout: float | None = None

    @property
    def timeout_s(self) -> float:
        """The collective timeout in seconds (``ddp_timeout``, else 1800; ``0`` counts as unset, as before)."""
        return float(self.timeout or DEFAULT_TIMEOUT_S)


@dataclass(frozen=True)
class DDPSettings(ProcessGroupSettings):
    """``DistributedDataParallel`` keywords (mirrors the HF Trainer's ``ddp_*`` options).

    Attributes:
        find_unused_parameters (bool): ``ddp_find_unused_parameters`` (None there means False).
        broadcast_buffers (bool | None): ``ddp_broadcast_buffers``; passed to DDP only when False (newer torch
            deprecates the flag).
        static_graph (bool | None): ``ddp_static_graph`` (HF 5); None: the strategy's own ``static_graph``.
        bucket_cap_mb (int | None): ``ddp_bucket_cap_mb`` (MB); None or 0: DDP's default (25 MB).
    """

    find_unused_parameters: bool = False
    broadcast_buffers: bool | None = None
    static_graph: bool | None = None
    bucket_cap_mb: int | None = None


@dataclass(frozen=True)
class FSDPSettings(ProcessGroupSettings):
    """FSDP2 settings.

    Attributes:
        options (FSDPOptions | None): the resolved FSDP options (``fsdp`` words, ``fsdp_config``, the strategy's
            own keyword arguments); None: keep the strategy's current options.
        save_on_each_node (bool): full-weight files are written by every node's local rank 0 (HF
            ``save_on_each_node``).
        save_safetensors (bool): full weights as ``model.safetensors`` (True) or ``pytorch_model.bin``.
    """

    options: FSDPOptions | None = None
    save_on_each_node: bool = False
    save_safetensors: bool = True


@dataclass(frozen=True)
class DeepSpeedSettings(ProcessGroupSettings):
    """The resolved DeepSpeed config and what the engine build needs besides it.

    Attributes:
        config (dict): the resolved DeepSpeed config (``"auto"`` values filled, except the schedule's step counts;
            see :func:`taskfit.strategies.deepspeed_config.resolve_config`).
        weight_decay (float): for the parameter groups of a DeepSpeed-built optimizer.
        warmup_steps (Callable[[int], int]): warmup optimizer steps of a run of N steps (``warmup_steps`` /
            ``warmup_ratio``).
        make_scheduler (Callable[[Optimizer, int], LRScheduler] | None): the run's LR schedule over a
            DeepSpeed-built optimizer for N steps, when the config has no ``scheduler`` section.
    """

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    weight_decay: float = 0.0
    warmup_steps: Callable[[int], int] = no_warmup
    make_scheduler: Callable[[Any, int], Any] | None = None


@dataclass(frozen=True)
class DeepSpeedRequest:
    """What a :class:`~taskfit.strategies.deepspeed.DeepSpeedStrategy` was built with, before the run's options
    fill it in (the registry presets and the constructor's arguments).

    Attributes:
        config (dict | str | None): the strategy's own config (None: the ``deepspeed`` option's).
        stage (int | None): ZeRO stage of the preset.
        offload_optimizer (str | None): ``"cpu"``/``"nvme"``.
        offload_parameters (str | None): ``"cpu"``/``"nvme"``.
        nvme_path (str): folder for NVMe offload.
        on_cpu (bool): the run uses DeepSpeed's CPU accelerator.
    """

    config: Any = None
    stage: int | None = None
    offload_optimizer: str | None = None
    offload_parameters: str | None = None
    nvme_path: str = "/local_nvme"
    on_cpu: bool = True

    def preset(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~taskfit.strategies.deepspeed_config.resolve_config` it fixes."""
        return dict(stage=self.stage, offload_optimizer=self.offload_optimizer,
                    offload_parameters=self.offload_parameters, nvme_path=self.nvme_path, on_cpu=self.on_cpu)


@dataclass(frozen=True)
class XLAFSDPSettings(StrategySettings):
    """PyTorch/XLA FSDP settings, read when the strategy is built.

    Attributes:
        fsdp_config (dict): ``fsdp_config`` with the ``fsdp_`` prefixes removed (keys checked).
        devices (Any): the ``devices`` option as given (``"auto"``: FSDPv2 takes every device of the host).
    """

    fsdp_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    devices: Any = "auto"


__all__ = ["DDPSettings", "DEFAULT_TIMEOUT_S", "DeepSpeedRequest", "DeepSpeedSettings", "FSDPSettings",
           "ProcessGroupSettings", "StrategySettings", "XLAFSDPSettings"]
