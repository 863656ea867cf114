"""Device capabilities asked of the Accelerator (issue 13, item 4): RNG state, pinned memory, memory counters,
cache release, dtype / loss-scaling / TF32 support, and the precision plugin the connector picks per strategy.
Real calls on the accelerators this machine has; hardware that is absent skips with a reason."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers.models import Regression, regression_data
from lightning_utilities.core.imports import RequirementCache
from taskfit import Fit
from taskfit.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.connector import resolve_components
from taskfit.precision import (
    PRECISIONS,
    DeepSpeedPrecision,
    FSDPPrecision,
    MixedPrecision,
    Precision,
    XLAPrecision,
    build_precision,
)
from taskfit.seed import rng_states, set_rng_states
from taskfit.strategies.fsdp import FSDPStrategy
from taskfit.strategies.xla import XLAStrategy

ALL_NAMES = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MPS = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple MPS device")
TORCH_XLA = pytest.mark.skipif(not RequirementCache(module="torch_xla"),
                               reason="torch_xla is not installed (it pins torch 2.9.0): run `make test-xla`")
DEEPSPEED = pytest.mark.skipif(not RequirementCache("deepspeed>=0.14"), reason="deepspeed is not installed")


class GeneratorAccelerator(CPUAccelerator):
    """A CPU accelerator with a generator of its own (stands in for a device RNG on this CPU-only machine) that
    also asks for pinned memory: real objects, not mocks."""

    name = "gen"

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(7)

    def get_rng_state(self):
        return self.generator.get_state()

    def set_rng_state(self, state) -> None:
        if state is not None:  # None: nothing was saved for this kind (the contract's no-op)
            self.generator.set_state(state)

    def supports_pin_memory(self) -> bool:
        return True


# --------------------------------------------------------------------------------------------------- CPU ---
def test_cpu_accelerator_capabilities():
    acc, dev = CPUAccelerator(), torch.device("cpu")
    assert acc.get_rng_state() is None  # torch's CPU generator is a host state (taskfit.seed)
    acc.set_rng_state(None)
    assert acc.supports_pin_memory() is False
    assert acc.memory_stats(dev) == {}
    acc.reset_peak_memory_stats(dev)
    acc.empty_cache()
    assert all(acc.supports_dtype(d) for d in (torch.float16, torch.bfloat16, torch.float64))
    assert acc.supports_loss_scaling() is True  # torch.amp.GradScaler("cpu") exists in this torch
    assert acc.supports_tf32(dev) is False and acc.tf32_enabled() is False
    with pytest.raises(ValueError, match="tf32=True only applies to CUDA GPUs.*'cpu'"):
        acc.set_tf32(True, dev)
    for name in ALL_NAMES:
        acc.check_precision(PRECISIONS.build(name))
    assert acc.device_name(dev) == "cpu"


def test_rng_states_capture_the_accelerator_generator_and_restore_it():
    """The device generator is saved under the accelerator's name and restored through it, with the host ones."""
    acc = GeneratorAccelerator()
    states = rng_states(acc)
    assert set(states) == {"python", "numpy", "torch", "gen"}
    expected = (random.random(), float(np.random.rand()), torch.rand(3), torch.rand(3, generator=acc.generator))
    set_rng_states(states, acc)
    again = (random.random(), float(np.random.rand()), torch.rand(3), torch.rand(3, generator=acc.generator))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2]) and torch.equal(expected[3], again[3])
    # states from another device kind leave this generator alone; no accelerator: host states only
    other = GeneratorAccelerator()
    other.name = "other"
    torch.rand(1, generator=acc.generator)
    before = acc.generator.get_state()
    set_rng_states(rng_states(other), acc)
    assert torch.equal(acc.generator.get_state(), before)
    assert set(rng_states()) == {"python", "numpy", "torch"}


def test_checkpoint_rng_file_holds_the_accelerator_state(tmp_path):
    """A real run saves the accelerator's generator (under its name) next to the host ones in rng_state_0.pt."""
    acc = GeneratorAccelerator()
    fit = Fit(FitArguments(output_dir=str(tmp_path), max_steps=2, save_strategy="steps", save_steps=2,
                           per_device_train_batch_size=4, report_to="none", disable_tqdm=True,
                           logging_strategy="no", dataloader_pin_memory=False), accelerator=acc)
    fit.fit(Regression(features=4, seed=None), regression_data(16, features=4))
    saved = torch.load(tmp_path / "checkpoint-2" / "rng_state_0.pt", weights_only=True)
    assert set(saved) == {"python", "numpy", "torch", "gen"}
    assert torch.equal(saved["gen"], acc.generator.get_state())  # nothing drew from it during the run


@pytest.mark.parametrize("accelerator, pinned", [(CPUAccelerator(), False), (GeneratorAccelerator(), True)])
def test_pin_memory_follows_the_accelerator(tmp_path, accelerator, pinned):
    """dataloader_pin_memory=True pins only when the run's accelerator copies from host memory (CUDA); a CPU run
    never pins, whatever torch.cuda.is_available() says."""
    fit = Fit(FitArguments(output_dir=str(tmp_path), dataloader_pin_memory=True, report_to="none"),
              accelerator=accelerator)
    loader = fit._loader([{"x": torch.zeros(2)}] * 4, train=True, collator=None, what="train dataset")
    assert loader.pin_memory is pinned
    fit = Fit(FitArguments(output_dir=str(tmp_path), dataloader_pin_memory=False, report_to="none"),
              accelerator=accelerator)
    assert fit._loader([{"x": torch.zeros(2)}] * 4, train=True, collator=None, what="d").pin_memory is False


# ------------------------------------------------------------------------------------------ MPS, CUDA, XLA ---
def test_mps_dtype_rules_without_a_mac(monkeypatch):
    """The MPS rules are the accelerator's: no float64, bfloat16 from macOS 14 (faked both ways)."""
    acc = MPSAccelerator()
    assert acc.supports_dtype(torch.float64) is False and acc.supports_dtype(torch.float16) is True
    assert acc.supports_pin_memory() is False and acc.supports_loss_scaling() is True
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False, raising=False)
    assert acc.supports_dtype(torch.bfloat16) is False
    with pytest.raises(ValueError, match="macOS 14"):
        acc.check_precision(PRECISIONS.build("bf16-true"))
    with pytest.raises(ValueError, match="no float64"):
        acc.check_precision(PRECISIONS.build("64-true"))


@MPS
def test_mps_rng_round_trip_and_memory():
    acc = MPSAccelerator()
    state = acc.get_rng_state()
    a = torch.rand(4, device="mps").cpu()
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(4, device="mps").cpu())
    assert acc.memory_stats(torch.device("mps"))["allocated"] >= 0
    acc.empty_cache()


@CUDA
@pytest.mark.cuda
def test_cuda_rng_round_trip_memory_and_pinning():
    acc, dev = CUDAAccelerator(), torch.device("cuda", 0)
    torch.rand(1, device=dev)  # initialise CUDA
    state = acc.get_rng_state()
    a = torch.rand(4, device=dev).cpu()
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(4, device=dev).cpu())
    acc.reset_peak_memory_stats(dev)
    x = torch.empty(1 << 20, device=dev)
    stats = acc.memory_stats(dev)
    assert stats["allocated"] >= x.numel() * 4 and stats["peak_allocated"] >= stats["allocated"]
    del x
    acc.empty_cache()
    assert acc.supports_pin_memory() is True and acc.supports_loss_scaling() is True


def test_xla_without_torch_xla_has_no_generator_and_no_loss_scaling():
    acc = XLAAccelerator()
    if not RequirementCache(module="torch_xla"):
        assert acc.get_rng_state() is None
    assert acc.supports_loss_scaling() is False and acc.supports_pin_memory() is False
    with pytest.raises(ValueError, match="not supported on 'xla' devices"):
        acc.check_precision(MixedPrecision("16-mixed"))


@TORCH_XLA
@pytest.mark.xla
def test_xla_rng_round_trip(monkeypatch):
    """The XLA generator (never saved before) is captured and restored through the accelerator."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    import torch_xla

    acc = XLAAccelerator()
    dev = torch_xla.device()
    acc.set_rng_state(1234)
    state = acc.get_rng_state()
    a = torch.rand(4, device=dev).cpu()
    acc.set_rng_state(state)
    assert torch.equal(a, torch.rand(4, device=dev).cpu())
    states = rng_states(acc)
    assert states["xla"] == state


# ----------------------------------------------------------------------------- precision per strategy ---
def test_connector_picks_the_typed_precision_plugin_per_strategy():
    """FSDP gets FSDPPrecision (its mixed-precision policy), DeepSpeed DeepSpeedPrecision, plain strategies the
    registry's plugins; the name is parsed once into the plugin."""
    fsdp = resolve_components(FitArguments(strategy="fsdp", devices=2, precision="bf16-mixed"))
    assert type(fsdp.precision) is FSDPPrecision and fsdp.precision.autocast_dtype == torch.bfloat16
    policy = fsdp.mixed_precision_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert FSDPPrecision("32-true").mixed_precision_policy().param_dtype is None
    assert FSDPPrecision("bf16-true").param_dtype == torch.bfloat16
    ddp = resolve_components(FitArguments(strategy="ddp", devices=2, precision="bf16-mixed"))
    assert type(ddp.precision) is MixedPrecision
    single = resolve_components(FitArguments(precision="32-true"))
    assert type(single.precision) is Precision


@DEEPSPEED
def test_connector_picks_deepspeed_precision():
    ds = resolve_components(FitArguments(strategy="deepspeed", devices=2, precision="bf16-mixed"))
    assert type(ds.precision) is DeepSpeedPrecision and ds.precision.engine_dtype == torch.bfloat16
    assert ds.config["bf16"]["enabled"] is True


def test_xla_strategies_take_xla_precision():
    assert XLAStrategy.precision_plugin is XLAPrecision and FSDPStrategy.precision_plugin is FSDPPrecision
    plugin = build_precision("bf16-mixed", XLAStrategy.precision_plugin)
    assert type(plugin) is XLAPrecision and plugin.autocast_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'16-mixed' is not supported on 'xla'.*bf16-mixed"):
        build_precision("16-mixed", XLAPrecision)
    with pytest.raises(ValueError, match="Unknown precision 'bf16-mixd'.*bf16-mixed"):
        build_precision("bf16-mixd", XLAPrecision)


def test_a_plain_plugin_instance_is_refused_by_a_strategy_with_its_own_plugin():
    with pytest.raises(ValueError, match="strategy='fsdp' needs a FSDPPrecision precision plugin, got MixedPrecision"):
        resolve_components(FitArguments(strategy="fsdp", devices=2), plugins=[MixedPrecision("bf16-mixed")])
    plugin = FSDPPrecision("bf16-mixed")
    assert resolve_components(FitArguments(strategy="fsdp", devices=2), plugins=[plugin]).precision is plugin


def test_full_eval_precision_is_switched_by_the_strategy_and_back():
    """fp16_full_eval: the strategy switches itself to a 16-bit plugin for a stand-alone evaluation and back to
    its training plugin (the same object) before training; nothing outside replaces it."""
    strategy = resolve_components(FitArguments(precision="32-true"))
    training = strategy.precision
    module = torch.nn.Linear(2, 2)
    strategy.use_eval_precision(module, torch.float16)
    assert strategy.precision.param_dtype == torch.float16 and module.weight.dtype == torch.float16
    strategy.use_eval_precision(module, torch.float16)  # already there: unchanged
    strategy.use_eval_precision(module, None)
    assert strategy.precision is training and module.weight.dtype == torch.float32
