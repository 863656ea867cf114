"""F-LOOP-7 (auto_find_batch_size), F-MEM-5 (memory estimate and `taskfit estimate`), F-MEM-3 (SDPA) and F-MEM-4
(data preloading and non-blocking copies)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from _tasks import TokenModel, args, tiny_gpt2, token_data
from taskfit import Fit, FitArguments, estimate_memory
from taskfit.efficiency import attention_implementation, is_out_of_memory

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class NeedsSmallBatch(TokenModel):
    """Asks the allocator for an impossible 4 EiB when a micro-batch has more than ``limit`` samples (a device
    whose memory fits ``limit`` samples); the error is the real CPU/CUDA allocator's out-of-memory error."""

    def __init__(self, limit=4, device="cpu"):
        super().__init__()
        self.limit, self.device_kind, self.sizes = limit, device, []

    def training_step(self, batch, batch_idx):
        n = batch["input_ids"].shape[0]
        self.sizes.append(n)
        if n > self.limit:
            torch.empty(1 << 62, dtype=torch.uint8, device=self.device_kind)
        return super().training_step(batch, batch_idx)


def test_f_loop_7_auto_find_batch_size_halves_on_oom(tmp_path, caplog):
    """F-LOOP-7: on an allocator out-of-memory error the batch is halved (16 -> 8 -> 4), each retry is logged, the
    weights are restored, and the run equals one started at batch size 4."""
    data = token_data(32)
    module = NeedsSmallBatch()
    fit = Fit(args(tmp_path, max_steps=3, per_device_train_batch_size=16, auto_find_batch_size=True))
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        fit.fit(module, data)
    assert module.sizes[:2] == [16, 8] and set(module.sizes[2:]) == {4}
    assert fit.args.per_device_train_batch_size == 4 and fit.state.train_batch_size == 4
    assert [r.getMessage() for r in caplog.records if "auto_find_batch_size" in r.getMessage()] == [
        "auto_find_batch_size: out of memory at per_device_train_batch_size=16; retrying with 8",
        "auto_find_batch_size: out of memory at per_device_train_batch_size=8; retrying with 4"]
    direct = NeedsSmallBatch()
    Fit(args(tmp_path, max_steps=3, per_device_train_batch_size=4)).fit(direct, data)
    for a, b in zip(module.parameters(), direct.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_f_loop_7_auto_find_batch_size_errors(tmp_path):
    """F-LOOP-7: a DataLoader's fixed batch size cannot shrink (clear ValueError); non-OOM errors pass through;
    OOM at batch size 1 is re-raised."""
    with pytest.raises(ValueError, match="train_data is a DataLoader with a fixed batch size"):
        Fit(args(tmp_path, max_steps=1, auto_find_batch_size=True)).fit(
            NeedsSmallBatch(), DataLoader(token_data(16), batch_size=8))
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        Fit(args(tmp_path, max_steps=1, per_device_train_batch_size=2, auto_find_batch_size=True)).fit(
            NeedsSmallBatch(limit=0), token_data(8))
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and is_out_of_memory(torch.OutOfMemoryError("x"))


def _batch(n):
    data = token_data(n)
    return {k: torch.stack([d[k] for d in data]) for k in data[0]}


def test_f_mem_5_estimate_exact_params_grads_and_activations_scale(tmp_path):
    """F-MEM-5: parameters + gradients + AdamW state are exact for a known model (measured after a real step);
    precision changes the bytes per parameter; the traced activations grow linearly with the batch;
    ZeRO-3/FSDP shard by the world size and offload moves the optimizer state to the host."""
    module = TokenModel()
    n = sum(p.numel() for p in module.parameters())
    n_tensors = len(list(module.parameters()))
    est = estimate_memory(module, FitArguments(), _batch(4))
    assert (est.parameters, est.gradients, est.optimizer_state) == (4 * n, 4 * n, 8 * n + 4 * n_tensors)
    fit = Fit(args(tmp_path, max_steps=1, per_device_train_batch_size=4, learning_rate=1e-3))
    fit.fit(module, token_data(4))
    measured = sum(t.nbytes for st in fit.optimizer.state.values() for t in st.values())
    assert est.parameters + est.gradients + est.optimizer_state == 8 * n + measured
    assert est.activations > 0 and est.total == est.parameters + est.gradients + est.optimizer_state + est.activations
    a8 = estimate_memory(module, {}, _batch(8)).activations
    a16 = estimate_memory(module, {}, _batch(16)).activations
    assert a16 - a8 == pytest.approx(2 * (a8 - est.activations), rel=0.05) and a8 > est.activations > 0
    half = estimate_memory(module, {"precision": "bf16-true"})
    assert half.parameters == 2 * n and half.optimizer_state == 4 * n + 4 * n_tensors
    mixed = estimate_memory(module, {"bf16": True})
    linear_weights = sum(p.numel() for m in module.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters())
    assert mixed.parameters == 4 * n and mixed.precision_copies == 2 * linear_weights
    z3 = estimate_memory(module, {"strategy": "deepspeed_stage_3_offload"}, world_size=4)
    assert z3.parameters == n and z3.optimizer_state == 0 and z3.offloaded_optimizer_state == (8 * n + 4 * n_tensors) // 4
    assert "optimizer state" in est.table() and json.dumps(est.to_dict())


def test_f_mem_5_estimate_cli(tmp_path, capsys, monkeypatch):
    """F-MEM-5: `taskfit estimate --config run.yaml` prints the table and a JSON line whose bytes match the API."""
    from taskfit.cli.app import main

    (tmp_path / "est_task.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom _tasks import TokenModel, token_data\n"
        "def data():\n    return {'train': token_data(8)}\n" % str(sys.modules["_tasks"].__file__.rsplit("/", 1)[0]))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "run.yaml"
    cfg.write_text("module: est_task:TokenModel\ndata: est_task:data\noptim: adafactor\n"
                   "per_device_train_batch_size: 4\n")
    assert main(["estimate", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert out[0].startswith("memory estimate: precision=32-true optim=adafactor")
    expected = estimate_memory(TokenModel(), FitArguments(optim="adafactor"), _batch(4))
    assert result["optimizer_state"] == expected.optimizer_state and result["activations"] == expected.activations
    assert result["total"] == expected.total


def test_f_mem_3_hf_models_use_sdpa():
    """F-MEM-3: a Hugging Face model built here runs its attention through scaled_dot_product_attention."""
    from torch import nn

    model = tiny_gpt2()
    assert attention_implementation(nn.ModuleDict({"lm": model})) == {"lm": "sdpa"}
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(1)
        return original(*a, **k)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert len(calls) == 2  # one per layer


def test_f_mem_4_preloading_options_reach_the_loader(tmp_path):
    """F-MEM-4: workers, persistent workers and prefetch factor reach the DataLoader; pin_memory only with an
    accelerator (pinned host memory helps only host-to-device copies)."""
    fit = Fit(args(tmp_path, max_steps=2, dataloader_num_workers=2, dataloader_persistent_workers=True,
                   dataloader_prefetch_factor=3, dataloader_pin_memory=True))
    fit.fit(TokenModel(), token_data(16))
    loader = fit.train_loader
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 3)
    assert loader.pin_memory == torch.cuda.is_available()


@pytest.mark.cuda
@CUDA
def test_f_mem_4_cuda_pinned_batches_copied_non_blocking(tmp_path):
    """F-MEM-4 on CUDA: batches come from pinned memory and the strategy copies them to the GPU."""
    from taskfit.accelerators import CUDAAccelerator
    from taskfit.precision import Precision
    from taskfit.strategies.single_device import SingleDeviceStrategy

    strategy = SingleDeviceStrategy(accelerator=CUDAAccelerator(), device=torch.device("cuda", 0),
                                    precision=Precision())
    fit = Fit(args(tmp_path, max_steps=2, dataloader_pin_memory=True), strategy=strategy)
    fit.fit(TokenModel(), token_data(16))
    batch = next(iter(fit.train_loader))
    assert batch["input_ids"].is_pinned()
    moved = strategy.batch_to_device(batch)
    assert moved["input_ids"].is_cuda and torch.equal(moved["input_ids"].cpu(), batch["input_ids"])


@pytest.mark.cuda
@CUDA
def test_f_loop_7_cuda_auto_find_batch_size_real_oom(tmp_path):
    """F-LOOP-7 on CUDA: a real CUDA out-of-memory error (4 EiB request) halves the batch until it fits."""
    from taskfit.accelerators import CPUAccelerator
    from taskfit.precision import Precision
    from taskfit.strategies.single_device import SingleDeviceStrategy

    strategy = SingleDeviceStrategy(accelerator=CPUAccelerator(), device=torch.device("cuda", 0),
                                    precision=Precision())
    module = NeedsSmallBatch(device="cuda")
    fit = Fit(args(tmp_path, max_steps=2, per_device_train_batch_size=16, auto_find_batch_size=True),
              strategy=strategy)
    fit.fit(module, token_data(32))
    assert fit.args.per_device_train_batch_size == 4 and module.sizes[:2] == [16, 8]


def test_f_loop_7_auto_find_batch_size_with_model_init(tmp_path):
    """F-LOOP-7: with model_init each retry starts from a freshly built model (same seed, same start)."""
    built = []

    def model_init():
        built.append(NeedsSmallBatch())
        return built[-1]

    fit = Fit(args(tmp_path, max_steps=2, per_device_train_batch_size=8, auto_find_batch_size=True),
              model_init=model_init)
    fit.fit(None, token_data(16))
    assert len(built) == 2 and fit.model is built[1] and built[1].sizes == [4, 4]
