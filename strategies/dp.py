"""``torch.nn.DataParallel`` (``strategy="dp"``; F-STRAT-2): one process drives several CUDA devices, splitting
each batch across them. Mirrors Lightning's ``DataParallelStrategy`` and the HF Trainer's multi-GPU single-process
mode. DDP is faster (one process per device); DP exists for single-process convenience."""

from __future__ import annotations

from typing import Any, Callable

import torch

from taskfit.accelerators.accelerator import Accelerator
from taskfit.io.checkpoint_io import CheckpointIO
from taskfit.precision.precision import Precision
from taskfit.strategies.settings import StrategySettings
from taskfit.strategies.strategy import Strategy
from taskfit.strategies.wrapper import StepForward


class DataParallelStrategy(Strategy):
    """Replicate the module on every given CUDA device in this process; the training step's outputs are gathered
    on the first device and a returned loss with one value per device is averaged.

    Args:
        accelerator (Accelerator): must be CUDA.
        devices (list[torch.device]): two or more CUDA devices.
        precision (Precision), checkpoint_io (CheckpointIO | None): as for every strategy.

    Raises:
        ValueError: not CUDA, or fewer than two devices (``dp`` would only add overhead).
    """

    name = "dp"
    parallel = True

    def __init__(self, accelerator: Accelerator, devices: list[torch.device], precision: Precision,
                 checkpoint_io: CheckpointIO | None = None, num_nodes: int = 1,
                 settings: StrategySettings | None = None) -> None:
        kinds = {d.type for d in devices}
        if kinds != {"cuda"} or len(devices) < 2:
            raise ValueError(f"strategy='dp' (torch.nn.DataParallel) needs several CUDA devices in one process; got "
                             f"{len(devices)} {'/'.join(sorted(kinds))} device(s). Use strategy='ddp' for several "
                             "processes (also on CPU), or a single device without a strategy.")
        if num_nodes != 1:
            raise ValueError(f"strategy='dp' runs in one process on one machine; num_nodes={num_nodes}.")
        super().__init__(accelerator, devices[0], precision, checkpoint_io)
        self.devices = list(devices)
        if settings is not None:
            self.apply_settings(settings)

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = self.precision.convert_module(module).to(self.root_device)
        return torch.nn.DataParallel(StepForward(module), device_ids=[d.index for d in self.devices])

    def step_function(self, module: torch.nn.Module, name: str) -> Callable[..., Any]:
        if self.model is None or name != "training_step":
            return getattr(module, name)
        model = self.model

        def step(*args: Any) -> Any:
            out = model(name, *args)
            if isinstance(out, torch.Tensor) and out.dim() == 1:  # one loss per device
                return out.mean()
            if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor) and out["loss"].dim() == 1:
                return {**out, "loss": out["loss"].mean()}
            return out

        return step
