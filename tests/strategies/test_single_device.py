"""F-STRAT-1 and the connector: names resolve to components, bad names fail before any work."""

import pytest
import torch

from taskfit.accelerators import ACCELERATORS, CPUAccelerator
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.connector import resolve_components
from taskfit.io import TorchCheckpointIO
from taskfit.precision import PRECISIONS, MixedPrecision, Precision
from taskfit.registry import Registry
from taskfit.strategies import STRATEGIES, SingleDeviceStrategy


def test_F_STRAT_1_auto_resolves_to_single_device_cpu():
    s = resolve_components(FitArguments(strategy="auto", accelerator="auto", devices="auto"))
    assert isinstance(s, SingleDeviceStrategy) and isinstance(s.accelerator, CPUAccelerator)
    assert s.root_device == torch.device("cpu") and s.world_size == 1 and s.is_global_zero
    assert type(s.precision) is Precision and isinstance(s.checkpoint_io, TorchCheckpointIO)


def test_F_STRAT_1_collectives_are_identity_for_one_process():
    s = resolve_components(FitArguments())
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(s.reduce(t), t) and s.all_gather(t).shape == (1, 2) and s.broadcast({"a": 1}) == {"a": 1}


def test_precision_plugin_from_flags_and_instances():
    assert isinstance(resolve_components(FitArguments(bf16=True)).precision, MixedPrecision)
    custom = MixedPrecision()
    assert resolve_components(FitArguments(), plugins=[custom]).precision is custom
    with pytest.raises(TypeError, match="Unsupported plugin"):
        resolve_components(FitArguments(), plugins=[object()])


def test_unknown_and_pending_names():
    with pytest.raises(ValueError, match=r'Unknown strategy .fdsp.\. Did you mean "fsdp"\?'):
        resolve_components(FitArguments(strategy="fdsp"))
    with pytest.raises((ModuleNotFoundError, ValueError), match="strategy='xla'"):  # issue 6 landed: no CPU XLA
        resolve_components(FitArguments(strategy="xla", accelerator="cpu"))
    several = resolve_components(FitArguments(devices=2))  # several processes: DDP (nothing launched yet)
    assert several.name == "ddp" and several.world_size == 2 and several.global_rank == 0


def test_registry_lists_and_did_you_mean():
    reg = Registry("thing")
    reg.register("alpha", dict, x=1)
    assert reg.build("alpha") == {"x": 1} and reg.build("alpha", x=2) == {"x": 2}
    with pytest.raises(ValueError, match="already registered"):
        reg.register("alpha", dict)
    with pytest.raises(ValueError, match=r'Did you mean "alpha"\? Valid choices: alpha'):
        reg.get("alpah")
    assert {"cpu", "cuda", "mps"} <= set(ACCELERATORS.names())
    assert {"bf16-mixed", "16-mixed", "16-true"} <= set(PRECISIONS.names(include_pending=False))
    assert "deepspeed_stage_3_offload" in STRATEGIES


def test_cpu_accelerator_parse_devices():
    assert len(CPUAccelerator.parse_devices("auto")) == 1
    assert len(CPUAccelerator.parse_devices(3)) == 3
    assert len(CPUAccelerator.parse_devices("2")) == 2
    for bad in (0, -2, [0, 1], 1.5, True):
        with pytest.raises(ValueError, match="not valid for the CPU accelerator"):
            CPUAccelerator.parse_devices(bad)
    assert CPUAccelerator().get_device_stats(torch.device("cpu"))["cpu_rss_bytes"] > 1e6
