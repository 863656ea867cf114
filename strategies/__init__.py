"""Strategies (placement and communication) and their registry: ``STRATEGIES.get("fsdp")``."""

from taskfit.registry import Registry
from taskfit.strategies.ddp import DDPStrategy
from taskfit.strategies.parallel import DistributedError, ParallelStrategy
from taskfit.strategies.single_device import SingleDeviceStrategy
from taskfit.strategies.strategy import Strategy

STRATEGIES = Registry("strategy")
STRATEGIES.register("auto", SingleDeviceStrategy, description="single device for one device")
STRATEGIES.register("single_device", SingleDeviceStrategy, description="one process, one device")
STRATEGIES.register("ddp", DDPStrategy, description="DistributedDataParallel; re-runs the script per process")
STRATEGIES.register("ddp_spawn", DDPStrategy, description="DistributedDataParallel in spawned workers",
                    start_method="spawn")
_PENDING = {
    "dp": "the distributed-strategies issue (#5)",
    "fsdp": "the distributed-strategies issue (#5)",
    "fsdp2": "the distributed-strategies issue (#5)",
    "deepspeed": "the distributed-strategies issue (#5)",
    "deepspeed_stage_1": "the distributed-strategies issue (#5)",
    "deepspeed_stage_2": "the distributed-strategies issue (#5)",
    "deepspeed_stage_2_offload": "the distributed-strategies issue (#5)",
    "deepspeed_stage_3": "the distributed-strategies issue (#5)",
    "deepspeed_stage_3_offload": "the distributed-strategies issue (#5)",
    "xla": "the accelerators issue (#6)",
    "xla_fsdp": "the accelerators issue (#6)",
}
for _name, _where in _PENDING.items():
    STRATEGIES.register(_name, SingleDeviceStrategy, pending=f"lands with {_where}")

__all__ = ["STRATEGIES", "DDPStrategy", "DistributedError", "ParallelStrategy", "SingleDeviceStrategy", "Strategy"]
