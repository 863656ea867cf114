"""Real PyTorch/XLA runs on the CPU PJRT device (F-ACC-1, F-STRAT-5): ``make test-xla``.

torch_xla pins its own torch (2.9.0), so these tests run in a separate ``.venv-xla`` with ``PJRT_DEVICE=CPU``; in
the main environment (no torch_xla) the whole module skips. Only single-replica paths are covered: real
multi-process XLA collectives on CPU hang (pytorch/xla#9089). FSDPv2 (SPMD) runs in a fresh process over 2
virtual CPU devices (``CPU_NUM_DEVICES=2``), because SPMD mode must be switched on before any XLA tensor exists.

Tolerances: XLA's CPU backend compiles the step into one fused graph, so results differ from eager CPU by float32
rounding only (observed: ~6e-8 on the weights); ``TOL = 1e-6`` on every weight and logged loss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning_utilities.core.imports import RequirementCache
from torch.utils.data import TensorDataset

pytestmark = [
    pytest.mark.xla,
    pytest.mark.skipif(not RequirementCache(module="torch_xla"),
                       reason="torch_xla is not installed (it pins torch 2.9.0): run `make test-xla`"),
    pytest.mark.skipif(os.environ.get("PJRT_DEVICE", "").upper() != "CPU",
                       reason="set PJRT_DEVICE=CPU (as `make test-xla` does)"),
]

if RequirementCache(module="torch_xla") and os.environ.get("PJRT_DEVICE", "").upper() == "CPU" \
        and not os.environ.get("_TASKFIT_XLA_SPMD_JOB"):  # the FSDPv2 job must call use_spmd() first
    import torch_xla

    # Start the XLA runtime before anything in this process runs an eager backward: torch's autograd engine
    # sizes its per-device queues once, at its first backward, from the device counts known then; an XLA
    # backward after that fails with "device_ready_queues_ ... INTERNAL ASSERT FAILED".
    torch_xla.device()

from taskfit import Fit, FitArguments, TaskModule  # noqa: E402
from taskfit.accelerators import XLAAccelerator  # noqa: E402
from taskfit.connector import resolve_components  # noqa: E402
from taskfit.strategies.xla import XLAStrategy  # noqa: E402

TOL = 1e-6
HERE = Path(__file__).resolve()


class MLP(TaskModule):
    # kept local: a deeper MLP (3 layers, Tanh) gives XLA's fused graph real rounding to differ by within TOL
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                       torch.nn.Tanh(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, x[:, :4].argmax(-1))


def run(out: Path, accelerator: str = "auto", strategy: str = "auto", resume: str | None = None,
        **kw) -> tuple[Fit, MLP]:
    """6 optimizer steps of AdamW (lr 1e-2, clipping at 1.0, accumulation 2) on 64 samples, batch 8."""
    torch.manual_seed(1)
    module = MLP()
    a = dict(output_dir=str(out), disable_tqdm=True, report_to="none", save_strategy="no", logging_steps=1,
             max_steps=6, per_device_train_batch_size=8, gradient_accumulation_steps=2, max_grad_norm=1.0, seed=0,
             learning_rate=1e-2)
    a.update(kw)
    fit = Fit(FitArguments(**a), accelerator=accelerator, strategy=strategy)
    fit.fit(module, data(), resume_from_checkpoint=resume)
    return fit, module


def cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def losses(fit: Fit) -> list[float]:
    return [h["loss"] for h in fit.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The same run on the plain CPU accelerator (eager)."""
    fit, module = run(tmp_path_factory.mktemp("cpu"), accelerator="cpu")
    assert fit.strategy.root_device.type == "cpu" and fit.state.global_step == 6
    return cpu_state(module), losses(fit)


def test_auto_selects_xla_with_pjrt_cpu():
    """``accelerator="auto"`` picks XLA when torch_xla is installed and PJRT_DEVICE is set; one CPU device."""
    strategy = resolve_components(FitArguments())
    assert isinstance(strategy.accelerator, XLAAccelerator) and type(strategy) is XLAStrategy
    assert "PJRT device CPU" in strategy.accelerator.selection_reason
    assert XLAAccelerator.auto_device_count() == 1 and strategy.world_size == 1
    assert [d.type for d in XLAAccelerator.parse_devices("auto")] == ["xla"]
    with pytest.raises(ValueError, match="only 1 exist"):
        XLAAccelerator.parse_devices(2)
    hf = resolve_components(FitArguments(fsdp="full_shard", fsdp_config={"xla": True}))
    assert hf.name == "xla_fsdp" and not hf.v2


def test_training_equals_eager_cpu(tmp_path, reference):
    """6 steps through Fit on the XLA CPU device equal the eager CPU run within TOL (weights and losses)."""
    ref_state, ref_losses = reference
    fit, module = run(tmp_path)
    assert type(fit.strategy) is XLAStrategy and fit.strategy.root_device.type == "xla"
    assert next(module.parameters()).device.type == "xla" and fit.state.global_step == 6
    diff = max_diff(cpu_state(module), ref_state)
    print(f"XLA vs eager CPU: max |weight diff| = {diff:.3g}")
    assert diff < TOL
    assert losses(fit) == pytest.approx(ref_losses, abs=TOL) and len(ref_losses) == 6


def test_checkpoint_on_cpu_and_exact_resume(tmp_path):
    """Checkpoints written on XLA hold CPU tensors only (weights and optimizer state); resuming from step 3
    ends bitwise equal to the uninterrupted XLA run."""
    full_fit, full = run(tmp_path / "full", save_strategy="steps", save_steps=3)
    ckpt = tmp_path / "full" / "checkpoint-3"
    assert ckpt.is_dir(), sorted(p.name for p in (tmp_path / "full").iterdir())
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
    tensors = [t for s in optim["state"].values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert optim["state"][0]["exp_avg"].abs().sum() > 0
    from safetensors.torch import load_file

    weights = load_file(ckpt / "model.safetensors")
    assert weights and all(t.device.type == "cpu" for t in weights.values())

    resumed_fit, resumed = run(tmp_path / "resumed", resume=str(ckpt))
    assert resumed_fit.state.global_step == 6
    diff = max_diff(cpu_state(resumed), cpu_state(full))
    print(f"XLA resume from step 3 vs uninterrupted: max |weight diff| = {diff:.3g}")
    assert diff == 0.0
    assert losses(resumed_fit)[-3:] == losses(full_fit)[-3:]


def test_save_model_writes_cpu_weights(tmp_path):
    """``save_model`` after an XLA run writes the trained weights (CPU tensors) that load into a fresh module."""
    fit, module = run(tmp_path / "run")
    folder = fit.save_model(str(tmp_path / "export"))
    from safetensors.torch import load_file

    weights = load_file(Path(folder) / "model.safetensors")
    assert max_diff(weights, cpu_state(module)) == 0.0
    fresh = MLP()
    fresh.load_state_dict(weights)
    assert max_diff(cpu_state(fresh), cpu_state(module)) == 0.0


@pytest.mark.parametrize("config", [{"xla": True}, {"xla": True, "xla_fsdp_grad_ckpt": True,
                                                    "min_num_params": 500,
                                                    "xla_fsdp_settings": {"flatten_parameters": False}}],
                         ids=["v1", "v1-wrap-ckpt-settings"])
def test_xla_fsdp_v1_one_replica_equals_eager_cpu(tmp_path, reference, config):
    """HF ``fsdp="full_shard"`` + ``fsdp_config={"xla": True, ...}``: ``XlaFullyShardedDataParallel`` on one
    replica trains like eager CPU (TOL); ``save_model`` writes full weights with the module's own keys."""
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel

    ref_state, ref_losses = reference
    fit, module = run(tmp_path, fsdp="full_shard", fsdp_config=config)
    assert fit.strategy.name == "xla_fsdp" and isinstance(fit.strategy.model, XlaFullyShardedDataParallel)
    if "min_num_params" in config:  # auto-wrap made inner FSDP units (the 16x32 layer has 544 parameters)
        inner = [m for m in fit.strategy.model.modules() if isinstance(m, XlaFullyShardedDataParallel)]
        assert len(inner) > 1
    folder = fit.save_model(str(tmp_path / "export"))
    from safetensors.torch import load_file

    weights = load_file(Path(folder) / "model.safetensors")
    diff = max_diff(weights, ref_state)
    print(f"XLA-FSDP v1 {config} vs eager CPU: max |weight diff| = {diff:.3g}")
    assert diff < TOL
    assert losses(fit) == pytest.approx(ref_losses, abs=TOL)


_V2_JOB = r"""
import json, sys
import torch_xla
sys.path.insert(0, sys.argv[2])
import test_xla_cpu as t
fit, module = t.run(sys.argv[1] + "/run", fsdp="full_shard", fsdp_config={"xla": True, "xla_fsdp_v2": True})
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel
import torch_xla.runtime as xr
folder = fit.save_model(sys.argv[1] + "/export")
shardings = [torch_xla._XLAC._get_xla_sharding_spec(p) for p in fit.strategy.model.parameters()]
json.dump({"spmd": xr.is_spmd(), "devices": xr.global_runtime_device_count(), "folder": folder,
           "wrapped": isinstance(fit.strategy.model, SpmdFullyShardedDataParallel), "shardings": shardings,
           "losses": t.losses(fit)}, open(sys.argv[1] + "/result.json", "w"))
"""


def test_xla_fsdp_v2_spmd_two_virtual_devices_equals_eager_cpu(tmp_path, reference):
    """``fsdp_config={"xla": True, "xla_fsdp_v2": True}``: ``SpmdFullyShardedDataParallel`` over a 2-device
    SPMD mesh (``CPU_NUM_DEVICES=2``, one process) shards the parameters and trains like eager CPU (TOL).
    SPMD must be on before the runtime starts (``XLA_USE_SPMD=1``); without it the strategy raises a clear error
    (forcing SPMD onto a started runtime crashes with SIGSEGV)."""
    ref_state, ref_losses = reference
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2", "_TASKFIT_XLA_SPMD_JOB": "1",
           "XLA_USE_SPMD": "1"}
    proc = subprocess.run([sys.executable, "-c", _V2_JOB, str(tmp_path), str(HERE.parent)], env=env,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    late = subprocess.run([sys.executable, "-c", _V2_JOB, str(tmp_path / "late"), str(HERE.parent)],
                          env={k: v for k, v in env.items() if k != "XLA_USE_SPMD"}, capture_output=True, text=True,
                          timeout=500)
    assert late.returncode == 1 and "set XLA_USE_SPMD=1" in late.stderr, late.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["spmd"] and result["devices"] == 2 and result["wrapped"]
    assert any("devices=[2" in s for s in result["shardings"]), result["shardings"]  # sharded over the 2 devices
    from safetensors.torch import load_file

    weights = load_file(Path(result["folder"]) / "model.safetensors")
    diff = max_diff(weights, ref_state)
    print(f"XLA-FSDP v2 (SPMD, 2 virtual devices) vs eager CPU: max |weight diff| = {diff:.3g}")
    assert diff < TOL
    assert result["losses"] == pytest.approx(ref_losses, abs=TOL)


def test_F_ACC_1_tpu_metrics_debug_reports_xla_metrics_each_epoch(tmp_path, capsys):
    """``debug="tpu_metrics_debug"``: torch_xla's metrics report is printed after every training epoch."""
    from taskfit.callbacks.xla_metrics import XLAMetricsReport

    fit, _ = run(tmp_path, debug="tpu_metrics_debug", max_steps=-1, num_train_epochs=2)
    report = next(cb for cb in fit.callbacks if isinstance(cb, XLAMetricsReport))
    assert len(report.reports) == 2 and all("Metric: CompileTime" in r for r in report.reports)
    assert "Metric: CompileTime" in capsys.readouterr().out
