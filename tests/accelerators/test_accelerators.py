"""Accelerator selection and error logic (F-ACC-1..3, F-STRAT-5, F-PREC-2).

There is no GPU on these machines: CUDA and MPS availability is faked at the boundary (``torch.cuda.is_available``,
``torch.cuda.device_count``, ``torch.backends.mps.is_available``), which only exercises selection and error logic;
nothing here runs a kernel on a GPU. XLA tests check the errors raised when torch_xla is missing (real XLA runs
need ``torch_xla``: see tests/accelerators/test_xla_cpu.py).
"""

from __future__ import annotations

import pytest
import torch
from lightning_utilities.core.imports import RequirementCache

from taskfit import Fit
from taskfit.accelerators import (ACCELERATORS, CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator,
                                  choose_accelerator)
from taskfit.accelerators.mps import FALLBACK_HINT
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.connector import resolve_components
from taskfit.precision import PRECISIONS, MixedPrecision
from taskfit.fit.summary import format_summary

HAS_XLA = bool(RequirementCache(module="torch_xla"))


@pytest.fixture
def fake(monkeypatch):
    """``fake(cuda=N, mps=bool)``: pretend N CUDA devices / an MPS device exist (selection logic only)."""
    def _fake(cuda: int = 0, mps: bool = False) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    return _fake


# ------------------------------------------------------------------------------------ selection, F-ACC-1 ---
@pytest.mark.parametrize("cuda, mps, expected", [(2, True, "cuda"), (0, True, "mps"), (0, False, "cpu")])
def test_auto_order_cuda_mps_cpu_F_ACC_1(fake, cuda, mps, expected):
    """F-ACC-1: ``"auto"`` picks CUDA, then MPS, then CPU, and says why."""
    fake(cuda=cuda, mps=mps)
    name, reason = choose_accelerator("auto")
    assert name == expected and reason.startswith("auto:")
    if expected == "cuda":
        assert "2 CUDA device(s)" in reason


def test_auto_skips_xla_without_torch_xla_F_ACC_1(fake, monkeypatch):
    """F-ACC-1: a configured PJRT device is chosen only when torch_xla is installed (else CPU)."""
    fake()
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert XLAAccelerator.is_available() is HAS_XLA
    assert choose_accelerator("auto")[0] == ("xla" if HAS_XLA else "cpu")


def test_gpu_means_cuda_then_mps_F_ACC_1(fake):
    """F-ACC-1: ``"gpu"`` is CUDA when present, else MPS, else a ValueError naming both."""
    fake(cuda=1, mps=True)
    assert choose_accelerator("gpu")[0] == "cuda"
    fake(cuda=0, mps=True)
    assert choose_accelerator("gpu")[0] == "mps"
    fake()
    with pytest.raises(ValueError, match="accelerator='gpu' needs CUDA or MPS"):
        choose_accelerator("gpu")
    assert choose_accelerator("tpu")[0] == "xla"


def test_resolve_records_reason_and_use_cpu_F_ACC_1(fake):
    """F-ACC-1: the built accelerator carries why it was chosen; ``use_cpu=True`` forces the CPU over CUDA."""
    fake()
    strategy = resolve_components(FitArguments())
    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert strategy.accelerator.selection_reason == "auto: no CUDA, MPS or XLA device found"
    fake(cuda=2)
    strategy = resolve_components(FitArguments(use_cpu=True))
    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert strategy.accelerator.selection_reason == "use_cpu=True forces the CPU"


def test_use_mps_device_means_mps_F_ACC_1(fake):
    """F-ACC-1: the deprecated HF ``use_mps_device=True`` selects MPS; with another accelerator it is a conflict."""
    fake(mps=True)
    strategy = resolve_components(FitArguments(use_mps_device=True))
    assert isinstance(strategy.accelerator, MPSAccelerator) and strategy.root_device == torch.device("mps", 0)
    with pytest.raises(ValueError, match="use_mps_device=True .* conflicts with accelerator='cpu'"):
        resolve_components(FitArguments(use_mps_device=True, accelerator="cpu"))


def test_registry_rows_are_real_F_ACC_1():
    """F-ACC-1: no accelerator row is pending any more."""
    for name, cls in [("cuda", CUDAAccelerator), ("gpu", CUDAAccelerator), ("mps", MPSAccelerator),
                      ("xla", XLAAccelerator), ("tpu", XLAAccelerator)]:
        entry = ACCELERATORS.get(name)
        assert entry.pending is None and entry.factory is cls


def test_summary_line_says_what_and_why_F_ACC_1():
    """F-ACC-1/F-ACC-2: the start summary's accelerator line names the choice, the reason and the CUDA env."""
    s = {"accelerator": "CUDAAccelerator", "device": "cuda:0", "strategy": "ddp", "world_size": 2, "num_nodes": 1,
         "precision": "bf16-mixed", "parameters": 10, "trainable_parameters": 10, "per_device_batch_size": 4,
         "gradient_accumulation_steps": 1, "effective_batch_size": 8, "max_steps": 5, "steps_per_epoch": 5,
         "accelerator_reason": "auto: 2 CUDA device(s) visible",
         "visible_devices": {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": None}}
    line = format_summary(s).splitlines()[1]
    assert line.endswith("CUDAAccelerator (cuda:0), auto: 2 CUDA device(s) visible, CUDA_VISIBLE_DEVICES=2,3")


# ---------------------------------------------------------------------------------- CUDA devices, F-ACC-2 ---
@pytest.mark.parametrize("devices, expected", [
    (1, [0]), (2, [0, 1]), ("2", [0, 1]), ([1], [1]), ([1, 0], [1, 0]), ("0,1", [0, 1]), ("1,", [1]),
    ("auto", [0, 1]), (None, [0, 1]), (-1, [0, 1]), ("-1", [0, 1]),
])
def test_cuda_parse_devices_F_ACC_2(fake, devices, expected):
    """F-ACC-2: a count, a list of indices, ``"auto"`` and ``-1`` on 2 visible CUDA devices."""
    fake(cuda=2)
    assert CUDAAccelerator.parse_devices(devices) == [torch.device("cuda", i) for i in expected]


@pytest.mark.parametrize("devices, needle", [
    (4, "devices=4 asks for 4 CUDA devices, but only 2 exist"), ([0, 2], r"names CUDA device\(s\) \[2\]"),
    ([0, 0], "twice"), (0, "not valid"), (True, "not valid"), ("x", "not valid"), ([], "empty"),
])
def test_cuda_bad_devices_F_ACC_2(fake, devices, needle):
    """F-ACC-2: impossible ``devices`` values fail with the value and what exists."""
    fake(cuda=2)
    with pytest.raises(ValueError, match=needle):
        CUDAAccelerator.parse_devices(devices)


def test_cuda_visible_devices_reported_F_ACC_2(fake, monkeypatch):
    """F-ACC-2: ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER`` are reported and named in device errors."""
    fake(cuda=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert CUDAAccelerator.visible_devices() == {"CUDA_VISIBLE_DEVICES": "3,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    with pytest.raises(ValueError, match=r"only 2 exist \(CUDA_VISIBLE_DEVICES='3,5'\)"):
        CUDAAccelerator.parse_devices(4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert CUDAAccelerator.visible_devices()["CUDA_VISIBLE_DEVICES"] is None


def test_fit_devices_4_when_2_exist_F_ACC_2(fake):
    """F-ACC-2: ``Fit(accelerator="cuda", devices=4)`` with 2 GPUs fails at construction, before any work."""
    fake(cuda=2)
    with pytest.raises(ValueError, match="only 2 exist"):
        Fit(accelerator="cuda", devices=4)


def test_dp_with_one_cuda_device_F_ACC_1(fake):
    """F-ACC-1/F-STRAT-2: ``strategy="dp"`` with one CUDA device is refused up front."""
    fake(cuda=1)
    with pytest.raises(ValueError, match="strategy='dp'.*needs several CUDA devices"):
        resolve_components(FitArguments(accelerator="cuda", strategy="dp"))


def test_absent_cuda_refused_F_ACC_1(fake):
    """F-ACC-1: ``accelerator="cuda"`` without CUDA fails naming it."""
    fake()
    with pytest.raises(ValueError, match="accelerator='cuda' is not available on this machine"):
        resolve_components(FitArguments(accelerator="cuda"))


def test_tf32_off_cuda_refused_F_PREC_2():
    """F-PREC-2: ``tf32`` on the CPU fails at ``Fit(...)`` with the device named."""
    with pytest.raises(ValueError, match="tf32=True only applies to CUDA GPUs.*'cpu'"):
        Fit(tf32=True, accelerator="cpu")


def test_cuda_tf32_flags_F_PREC_2():
    """F-PREC-2: the accelerator reports the process-wide TF32 switches."""
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert CUDAAccelerator.tf32_flags()["matmul"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# ------------------------------------------------------------------------------------------- MPS, F-ACC-3 ---
@pytest.mark.parametrize("devices", [1, "auto", -1, [0], "1", None])
def test_mps_one_device_F_ACC_3(devices):
    """F-ACC-3: every way of asking for one device gives ``mps:0``."""
    assert MPSAccelerator.parse_devices(devices) == [torch.device("mps", 0)]


@pytest.mark.parametrize("devices", [2, [0, 1], [1]])
def test_mps_several_devices_refused_F_ACC_3(fake, devices):
    """F-ACC-3: MPS with several devices (or a missing index) fails saying MPS supports a single device."""
    fake(mps=True)
    with pytest.raises(ValueError, match="MPS supports a single device in a single process"):
        Fit(accelerator="mps", devices=devices)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "fsdp", "deepspeed", "deepspeed_stage_3_offload", "dp"])
def test_mps_distributed_refused_F_ACC_3(fake, strategy):
    """F-ACC-3: multi-process strategies on MPS fail at ``Fit(...)`` saying MPS supports a single process."""
    fake(mps=True)
    with pytest.raises(ValueError, match=f"strategy='{strategy}' cannot run on MPS: MPS supports a single process"):
        Fit(accelerator="mps", strategy=strategy)


def test_mps_precision_rules_F_ACC_3(fake):
    """F-ACC-3: float64 is refused on MPS; 16-mixed is allowed (GradScaler('mps') exists in this torch)."""
    fake(mps=True)
    with pytest.raises(ValueError, match="precision='64-true' cannot run on MPS: the MPS backend has no float64"):
        resolve_components(FitArguments(accelerator="mps", precision="64-true"))
    MPSAccelerator().check_precision(PRECISIONS.build("16-mixed"))
    MPSAccelerator().check_precision(PRECISIONS.build("32-true"))


def test_mps_bf16_needs_macos_14_F_ACC_3(monkeypatch):
    """F-ACC-3: bf16 on MPS needs macOS 14 (faked both ways)."""
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: False, raising=False)
    with pytest.raises(ValueError, match="macOS 14"):
        MPSAccelerator().check_precision(PRECISIONS.build("bf16-mixed"))
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: major <= 14, raising=False)
    MPSAccelerator().check_precision(PRECISIONS.build("bf16-mixed"))


def test_mps_missing_op_hint_F_ACC_3(monkeypatch):
    """F-ACC-3: a missing-operator NotImplementedError is re-raised with the PYTORCH_ENABLE_MPS_FALLBACK hint."""
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    msg = "The operator 'aten::foo' is not currently implemented for the MPS device."
    with pytest.raises(NotImplementedError) as err:
        with MPSAccelerator.missing_op_hint():
            raise NotImplementedError(msg)
    assert str(err.value) == f"{msg}\n{FALLBACK_HINT}" and "PYTORCH_ENABLE_MPS_FALLBACK=1" in str(err.value)
    assert isinstance(err.value.__cause__, NotImplementedError)
    with pytest.raises(NotImplementedError, match="^abstract method$"):  # not an MPS op: unchanged
        with MPSAccelerator.missing_op_hint():
            raise NotImplementedError("abstract method")
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")  # fallback already on: no hint
    original = NotImplementedError(msg)
    assert MPSAccelerator.with_fallback_hint(original) is original


# ----------------------------------------------------------------------------------- XLA, F-ACC-1/F-STRAT-5 ---
@pytest.mark.skipif(HAS_XLA, reason="torch_xla is installed")
@pytest.mark.parametrize("kwargs", [{"accelerator": "xla"}, {"accelerator": "tpu"}, {"strategy": "xla"},
                                    {"strategy": "xla_fsdp"}])
def test_xla_without_torch_xla_names_extra_F_STRAT_5(kwargs):
    """F-ACC-1/F-STRAT-5: XLA without torch_xla fails at ``Fit(...)`` naming the extra ``taskfit[xla]``."""
    with pytest.raises(ModuleNotFoundError, match=r"needs PyTorch/XLA \(torch_xla\).*pip install 'taskfit\[xla\]'"):
        Fit(**kwargs)


@pytest.mark.skipif(HAS_XLA, reason="torch_xla is installed")
def test_xla_parts_without_torch_xla_F_STRAT_5():
    """F-STRAT-5: the XLA accelerator and strategies raise the same error when built directly."""
    from taskfit.strategies import XLAFSDPStrategy, XLAStrategy

    for call in (lambda: XLAAccelerator.parse_devices(1), XLAAccelerator.auto_device_count,
                 lambda: XLAAccelerator().setup_device(torch.device("xla", 0)),
                 lambda: XLAStrategy(XLAAccelerator(), [torch.device("xla", 0)], MixedPrecision("bf16-mixed")),
                 lambda: XLAFSDPStrategy(XLAAccelerator(), [torch.device("xla", 0)], MixedPrecision("bf16-mixed"))):
        with pytest.raises(ModuleNotFoundError, match=r"taskfit\[xla\]"):
            call()


def test_pjrt_device_validated_F_ACC_1(monkeypatch):
    """F-ACC-1: ``PJRT_DEVICE`` is read case-insensitively; an unknown kind names the valid ones."""
    from taskfit.accelerators.xla import pjrt_device

    monkeypatch.setenv("PJRT_DEVICE", "cpu")
    assert pjrt_device() == "CPU"
    monkeypatch.setenv("PJRT_DEVICE", "GPU")
    with pytest.raises(ValueError, match="PJRT_DEVICE='GPU'.*TPU, CPU, CUDA, NEURON"):
        pjrt_device()


def test_16_mixed_without_fp16_device_F_PREC_2():
    """F-PREC-1/F-ACC-1: 16-mixed on XLA (no float16 autocast/GradScaler) is refused with bf16 suggested."""
    with pytest.raises(ValueError, match="'16-mixed' is not supported on 'xla' devices; use 'bf16-mixed'"):
        MixedPrecision("16-mixed").setup_device(torch.device("xla", 0))


def test_tpu_num_cores_only_on_xla_F_ACC_1():
    """F-ACC-1: HF ``tpu_num_cores`` is the XLA device count; on another accelerator it is an error."""
    with pytest.raises(ValueError, match="tpu_num_cores=8 only applies to accelerator='xla'"):
        resolve_components(FitArguments(tpu_num_cores=8, accelerator="cpu"))


def test_xla_strategy_needs_xla_accelerator_F_STRAT_5(fake):
    """F-STRAT-5: ``strategy="xla"`` on CUDA is a named conflict (torch_xla present) or names the extra."""
    fake(cuda=1)
    err = ValueError if HAS_XLA else ModuleNotFoundError
    with pytest.raises(err, match="strategy='xla'"):
        resolve_components(FitArguments(accelerator="cuda", strategy="xla"))
