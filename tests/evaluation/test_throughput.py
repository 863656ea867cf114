"""F-EVAL-4 (samples/s, tokens/s, tokens seen, FLOPs, FLOP/s, MFU, memory deltas) and F-OBS-4 (start summary)."""

from __future__ import annotations

import logging

import pytest
import torch
from taskfit import Fit, TaskModule
from taskfit.callbacks.throughput import PEAK_FLOPS, ThroughputMonitor, compute_dtype, peak_flops
from taskfit.metrics import MemoryTracker
from torch import nn
from torch.utils.data import TensorDataset

B, IN, HID, OUT = 4, 4, 8, 3
#: FLOPs of one batch through Linear(IN,HID)-ReLU-Linear(HID,OUT), forward + backward: forward 2*B*(IN*HID +
#: HID*OUT); backward: weight grads of both layers (same again) + the input grad of layer 2 only (layer 1's
#: input needs no grad): 2*B*HID*OUT.
FLOPS_PER_BATCH = 2 * B * (IN * HID + HID * OUT) * 2 + 2 * B * HID * OUT


# kept local: FLOPS_PER_BATCH is computed from these layer sizes
class MLP(TaskModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


# kept local: token batches (input_ids), the shape tokens per second counts
class TokenModel(TaskModule):
    """A dict-batch model with ``input_ids`` (B, T): tokens are counted from the shape."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)

    def training_step(self, batch, batch_idx):
        logits = self.head(self.emb(batch["input_ids"]))
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())


def _data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, IN, generator=g)
    return TensorDataset(x, x[:, :OUT].argmax(-1))


def _tokens(n: int = 16, length: int = 6) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (n, length), generator=g)
    return [{"input_ids": ids[i], "labels": ids[i]} for i in range(n)]


def _fit(tmp_path, **kw) -> Fit:
    extra = {k: kw.pop(k) for k in list(kw) if k in ("callbacks",)}
    opts = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
                per_device_train_batch_size=B, max_steps=8, logging_steps=4, optim="sgd")
    opts.update(kw)
    return Fit(**opts, **extra)


def test_flops_measured_with_flop_counter_and_mfu_with_a_given_peak_F_EVAL_4(tmp_path):
    """F-EVAL-4: FLOPs of a batch are measured once with FlopCounterMode and equal the hand count of the MLP's
    matmuls (forward + backward); flops_per_second = FLOPs/sample x samples/s; with a peak given, mfu =
    flops_per_second / peak; the final metrics carry train_flops_per_second and train_mfu."""
    monitor = ThroughputMonitor(peak_flops=1e9)
    fit = _fit(tmp_path, callbacks=[monitor])
    out = fit.fit(MLP(), _data())
    assert monitor.flops_per_sample * B == FLOPS_PER_BATCH
    rows = [h for h in fit.state.log_history if "samples_per_second" in h]
    assert [h["step"] for h in rows] == [4, 8]
    for h in rows:
        assert h["flops_per_second"] == pytest.approx(FLOPS_PER_BATCH / B * h["samples_per_second"], rel=1e-3)
        assert h["mfu"] == pytest.approx(h["flops_per_second"] / 1e9)
        assert "tokens_per_second" not in h  # these batches have no input_ids
    assert out["train_flops_per_second"] > 0 and out["train_mfu"] == pytest.approx(out["train_flops_per_second"] / 1e9)


def test_mfu_is_omitted_on_cpu_and_flops_may_come_from_the_module_F_EVAL_4(tmp_path):
    """F-EVAL-4: on CPU the peak is unknown, so no ``mfu`` is logged (never invented); a module attribute
    ``flops_per_batch`` replaces the measurement."""
    module = MLP()
    module.flops_per_batch = 1000
    monitor = ThroughputMonitor()
    fit = _fit(tmp_path, callbacks=[monitor])
    out = fit.fit(module, _data())
    assert monitor.flops_per_sample == 1000 / B and monitor.peak is None
    assert not any("mfu" in h for h in fit.state.log_history) and "train_mfu" not in out
    assert out["train_flops_per_second"] > 0


def test_tokens_per_second_and_tokens_seen_F_EVAL_4(tmp_path):
    """F-EVAL-4: ``include_tokens_per_second`` / ``include_num_input_tokens_seen`` add the monitor; tokens are
    ``input_ids`` elements: 8 steps x 4 samples x 6 tokens = 192 seen, logged as a running total (96 at step
    4), kept in ``state.num_input_tokens_seen`` and reported with ``train_tokens_per_second``."""
    fit = _fit(tmp_path, include_tokens_per_second=True, include_num_input_tokens_seen=True)
    assert sum(isinstance(cb, ThroughputMonitor) for cb in fit.callbacks) == 1
    out = fit.fit(TokenModel(), _tokens())
    rows = [h for h in fit.state.log_history if "tokens_per_second" in h]
    assert [(h["step"], h["num_input_tokens_seen"]) for h in rows] == [(4, 96), (8, 192)]
    for h in rows:
        assert h["tokens_per_second"] == pytest.approx(6 * h["samples_per_second"], rel=1e-3)
    assert out["num_input_tokens_seen"] == fit.state.num_input_tokens_seen == 192
    assert out["train_tokens_per_second"] == pytest.approx(192 / out["train_runtime"], rel=0.2)


def test_memory_metrics_per_stage_F_EVAL_4(tmp_path):
    """F-EVAL-4: ``skip_memory_metrics=False`` reports the train stage's RSS deltas (bytes); a stage that
    allocates 64 MiB and keeps it shows an alloc delta of at least that; one that frees it again shows it as
    the peak above the end value."""

    class Hog(MLP):
        def __init__(self, keep: bool) -> None:
            super().__init__()
            self.keep, self.held = keep, None

        def training_step(self, batch, batch_idx):
            if batch_idx == 0:
                block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched so it is resident
                self.held = block if self.keep else None
            return super().training_step(batch, batch_idx)

    out = _fit(tmp_path, skip_memory_metrics=False, max_steps=2).fit(Hog(keep=True), _data())
    assert out["train_mem_cpu_alloc_delta"] >= 60 * 2**20
    assert out["train_mem_cpu_peaked_delta"] >= 0
    assert _fit(tmp_path).fit(MLP(), _data()).get("train_mem_cpu_alloc_delta") is None  # default: skipped
    tracker = MemoryTracker(torch.device("cpu"))
    tracker.start()
    block = torch.ones(64 * 2**20 // 4)
    tracker.sample()
    del block
    mem = tracker.stop("eval")
    assert set(mem) == {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"}
    assert mem["eval_mem_cpu_peaked_delta"] >= 60 * 2**20  # freed before the end: a peak, not a delta
    assert abs(mem["eval_mem_cpu_alloc_delta"]) < 16 * 2**20


def test_peak_table_and_dtype_F_EVAL_4():
    """F-EVAL-4: the peak table is matched by device name and compute dtype; unknown devices/dtypes give
    None (so MFU is omitted); A100 is not mistaken for A10, nor L40S for L4."""
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_flops("NVIDIA A10", "bf16") == 125e12 and peak_flops("NVIDIA A10G", "bf16") is None
    assert peak_flops("NVIDIA L40S", "bf16") == 362e12 and peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None  # V100 has no bf16 tensor cores
    assert peak_flops("cpu", "fp32") is None
    assert (compute_dtype("bf16-mixed"), compute_dtype("16-mixed"), compute_dtype("64-true")) == ("bf16", "fp16", "fp64")
    assert compute_dtype("32-true") in ("fp32", "tf32") and all("bf16" in t or "fp16" in t for t in PEAK_FLOPS.values())
    with pytest.raises(ValueError, match="peak_flops must be a positive FLOP/s value; got 0"):
        ThroughputMonitor(peak_flops=0)


def test_logging_speed_forces_no_host_sync_F_EVAL_4(tmp_path, monkeypatch):
    """F-EVAL-4 / DESIGN.md hot path: the monitor counts samples and tokens from shapes, so with it on, no
    tensor is read to the host outside logging steps (4 and 8)."""
    calls = []
    fit = _fit(tmp_path, include_tokens_per_second=True, logging_steps=4)
    for name in ("item", "__float__", "__bool__", "__int__", "tolist"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _o=original, _n=name, **k):
            calls.append((_n, fit.state.global_step))
            return _o(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    fit.fit(TokenModel(), _tokens())
    monkeypatch.undo()
    assert {step for _, step in calls} <= {0, 4, 8}, calls


def test_start_summary_F_OBS_4(tmp_path, caplog):
    """F-OBS-4: fit logs a one-screen summary: accelerator, strategy, precision, world size, parameter counts
    (total/trainable), the effective batch size (4 per device x 2 accumulation x 1 process = 8) and the memory
    estimate (F-MEM-5) of weights, gradients and optimizer state."""
    module = MLP()
    module.net[0].weight.requires_grad_(False)
    fit = _fit(tmp_path, gradient_accumulation_steps=2, max_steps=2)
    with caplog.at_level(logging.INFO, logger="taskfit"):
        fit.fit(module, _data())
    s = fit.summary
    total = sum(p.numel() for p in module.parameters())
    assert (s["accelerator"], s["strategy"], s["precision"], s["world_size"]) == (
        "CPUAccelerator", fit.strategy.name, "32-true", 1)
    assert (s["parameters"], s["trainable_parameters"]) == (total, total - IN * HID)
    assert (s["effective_batch_size"], s["max_steps"], s["steps_per_epoch"]) == (8, 2, 4)
    # SGD without momentum keeps no state: weights (4 bytes each) + gradients of the trainable ones
    assert s["memory_estimate"] == 4 * total + 4 * (total - IN * HID)
    text = caplog.text
    assert "memory estimate" in text
    assert "taskfit run summary" in text and f"{total:,} ({total - IN * HID:,} trainable)" in text
    assert "4 per device x 2 accumulation x 1 process(es) = 8 samples per optimizer step" in text
