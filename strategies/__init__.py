"""Strategies (placement and communication) and their registry: ``STRATEGIES.get("fsdp")``."""

from taskfit.registry import Registry
from taskfit.strategies.ddp import DDPStrategy
from taskfit.strategies.dp import DataParallelStrategy
from taskfit.strategies.fsdp import FSDPStrategy
from taskfit.strategies.model_parallel import ModelParallelStrategy
from taskfit.strategies.deepspeed import DeepSpeedStrategy
from taskfit.strategies.parallel import DistributedError, ParallelStrategy
from taskfit.strategies.single_device import SingleDeviceStrategy
from taskfit.strategies.strategy import Strategy
from taskfit.strategies.xla import XLAStrategy
from taskfit.strategies.xla_fsdp import XLAFSDPStrategy

STRATEGIES = Registry("strategy")
STRATEGIES.register("auto", SingleDeviceStrategy, description="single device for one device")
STRATEGIES.register("single_device", SingleDeviceStrategy, description="one process, one device")
STRATEGIES.register("ddp", DDPStrategy, description="DistributedDataParallel; re-runs the script per process")
STRATEGIES.register("ddp_spawn", DDPStrategy, description="DistributedDataParallel in spawned workers",
                    start_method="spawn")
STRATEGIES.register("deepspeed", DeepSpeedStrategy, description="DeepSpeed; ZeRO stage from the config (default 2)")
for _stage in (1, 2, 3):
    STRATEGIES.register(f"deepspeed_stage_{_stage}", DeepSpeedStrategy, description=f"DeepSpeed ZeRO stage {_stage}",
                        stage=_stage)
STRATEGIES.register("deepspeed_stage_2_offload", DeepSpeedStrategy, stage=2, offload_optimizer="cpu",
                    description="DeepSpeed ZeRO-2, optimizer states offloaded to CPU (DeepSpeedCPUAdam)")
STRATEGIES.register("deepspeed_stage_3_offload", DeepSpeedStrategy, stage=3, offload_optimizer="cpu",
                    offload_parameters="cpu", description="DeepSpeed ZeRO-3, optimizer states and parameters on CPU")
STRATEGIES.register("deepspeed_stage_3_offload_nvme", DeepSpeedStrategy, stage=3, offload_optimizer="nvme",
                    offload_parameters="nvme", description="DeepSpeed ZeRO-3, optimizer states and parameters on NVMe")
STRATEGIES.register("fsdp", FSDPStrategy, description="FSDP2 (fully_shard): parameters, gradients and optimizer "
                    "state sharded over the processes")
STRATEGIES.register("fsdp2", FSDPStrategy, description="alias of 'fsdp' (built on FSDP2)")
STRATEGIES.register("model_parallel", ModelParallelStrategy, description="data x tensor parallel on a DeviceMesh "
                    "(configure_model or the model's tp_plan)")
STRATEGIES.register("dp", DataParallelStrategy, description="torch.nn.DataParallel over several CUDA devices")
STRATEGIES.register("xla", XLAStrategy, description="PyTorch/XLA: one replica per XLA device (extra 'xla')")
STRATEGIES.register("xla_fsdp", XLAFSDPStrategy, description="PyTorch/XLA FSDP (XlaFullyShardedDataParallel, or "
                    "SPMD FSDPv2 with fsdp_config xla_fsdp_v2)")

__all__ = ["STRATEGIES", "DDPStrategy", "DataParallelStrategy", "DeepSpeedStrategy", "DistributedError", "ModelParallelStrategy", "ParallelStrategy", "SingleDeviceStrategy", "Strategy",
           "XLAFSDPStrategy", "XLAStrategy"]
