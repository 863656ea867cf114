"""F-PREC-1, F-PREC-2, F-LOOP-3, F-LOOP-8: precision plugins, loss scaling, TF32 and the unscale-before-clip order.

The CPU tests run everywhere; the ``cuda`` ones run the same checks on a GPU (skipped without one).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from taskfit import Callback, Fit, FitArguments, TaskModule
from taskfit.precision import PRECISIONS, HalfTruePrecision, MixedPrecision, Precision, apply_tf32
from taskfit.strategies.single_device import SingleDeviceStrategy

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no", logging_steps=1,
                seed=0, per_device_train_batch_size=8, learning_rate=1e-2, lr_scheduler_type="constant")
    base.update(kw)
    return FitArguments(**base)


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, (x[:, :4].argmax(-1)) % 4)


# kept local: records the output and weight dtypes each step saw under the precision
class MLP(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.out_dtypes, self.param_dtypes = [], []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.out_dtypes.append(logits.dtype)
        self.param_dtypes.append(self.net[0].weight.dtype)
        return F.cross_entropy(logits.float(), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.param_dtypes.append(self.net[0].weight.dtype)
        self.log("loss", F.cross_entropy(self(x).float(), y))


class InjectInf(Callback):
    """Puts an inf into one gradient after the backward of optimizer step ``at`` (0-based)."""

    def __init__(self, at):
        self.at, self.weights, self.grad_norms, self.grad_dtypes = at, {}, [], []

    def on_after_backward(self, fit, module):
        if fit.state.global_step == self.at:
            module.net[0].weight.grad[0, 0] = float("inf")
            self.weights["before"] = module.net[0].weight.detach().clone()

    def on_before_optimizer_step(self, fit, module, optimizer):
        grads = [p.grad for p in module.parameters()]
        self.grad_dtypes.append(grads[0].dtype)
        self.grad_norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    def on_before_zero_grad(self, fit, module, optimizer):
        if fit.state.global_step == self.at:
            self.weights["after"] = module.net[0].weight.detach().clone()


def _cuda_strategy(precision):
    """A single-device strategy on the CUDA accelerator (the accelerator decides the TF32 check and pinning)."""
    from taskfit.accelerators import CUDAAccelerator

    return SingleDeviceStrategy(accelerator=CUDAAccelerator(), device=torch.device("cuda", 0), precision=precision)


def _check_skip_on_inf(tmp_path, **fit_kw):
    cb = InjectInf(at=2)
    fit = Fit(_args(tmp_path, max_steps=5, max_grad_norm=1.0), callbacks=[cb], **fit_kw)
    module = MLP()
    fit.fit(module, _data())
    scaler = fit.strategy.precision.scaler
    logs = [h for h in fit.state.log_history if "loss_scale" in h]
    # the step with the injected inf was skipped: weights untouched, the scale halved, the skip counted
    assert torch.equal(cb.weights["before"], cb.weights["after"])
    scales = [h["loss_scale"] for h in logs]
    assert scales[:2] == [65536.0, 65536.0] and scales[2] == 32768.0 and scales[-1] == 32768.0
    assert [h["skipped_steps"] for h in logs] == [0, 0, 1, 1, 1]
    assert fit.strategy.precision.skipped_steps == 1 and scaler.get_scale() == 32768.0
    assert fit.state.global_step == 5
    # other steps did change the weights
    assert all(torch.isfinite(p).all() for p in module.parameters())
    return fit, cb, module


def test_f_prec_1_16_mixed_skips_inf_step_and_scale_drops_cpu(tmp_path):
    """F-PREC-1 / F-LOOP-8: 16-mixed on CPU (GradScaler('cpu')): an injected inf gradient skips that step (weights
    unchanged), the loss scale drops 65536 -> 32768, and ``skipped_steps`` counts it in the logs."""
    fit, cb, module = _check_skip_on_inf(tmp_path, precision="16-mixed")
    assert isinstance(fit.strategy.precision, MixedPrecision) and fit.strategy.precision.scaler is not None
    assert set(module.out_dtypes) == {torch.float16} and set(module.param_dtypes) == {torch.float32}


def test_f_loop_3_gradients_unscaled_before_hook_and_clipping(tmp_path):
    """F-LOOP-3: under 16-mixed, on_before_optimizer_step sees unscaled gradients (same norm as the fp32 run, not
    65536 x), and the logged grad_norm (clipping's norm) is the unscaled one too."""
    norms = {}
    for precision in ("32-true", "16-mixed"):
        cb = InjectInf(at=-1)
        fit = Fit(_args(tmp_path, max_steps=3, max_grad_norm=1.0), callbacks=[cb], precision=precision)
        fit.fit(MLP(), _data())
        norms[precision] = (cb.grad_norms, [h["grad_norm"] for h in fit.state.log_history if "grad_norm" in h])
    hook32, logged32 = norms["32-true"]
    hook16, logged16 = norms["16-mixed"]
    assert hook16[0] == pytest.approx(hook32[0], rel=2e-2) and hook16[0] < 100
    assert logged16[0] == pytest.approx(hook16[0], rel=1e-4)
    assert logged16 == pytest.approx(logged32, rel=5e-2)


class ManualMLP(MLP):
    """Manual optimization: ``manual_backward`` then ``opt.step()``; records the loss-scaled gradient norm right
    after the backward with the scale in force, and the norm ``on_before_optimizer_step`` sees."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.scaled, self.seen = [], []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        scaler = self.trainer.strategy.precision.scaler
        self.scaled.append((_grad_norm(self), scaler.get_scale() if scaler is not None else 1.0))
        opt.step()
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.seen.append(_grad_norm(self))


def _grad_norm(module):
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()])))


def test_f_loop_3_manual_optimization_hook_sees_unscaled_gradients(tmp_path):
    """F-LOOP-3: under manual optimization with 16-mixed (GradScaler('cpu')), ``opt.step()`` unscales before
    ``on_before_optimizer_step`` as the automatic loop does (Lightning's precision plugin unscales before the hook
    in both modes): the hook's gradient norm is the loss-scaled norm divided by the scale, not 65536 x the true."""
    module = ManualMLP()
    Fit(_args(tmp_path, max_steps=3), precision="16-mixed").fit(module, _data())
    assert len(module.seen) == len(module.scaled) == 3
    assert module.scaled[0][1] == 65536.0
    for seen, (scaled, scale) in zip(module.seen, module.scaled):
        assert seen == pytest.approx(scaled / scale, rel=1e-5) and seen < 100


def test_f_loop_3_unclipped_16_mixed_logs_the_true_norm_and_keeps_training(tmp_path):
    """F-LOOP-3: without clipping, the grad_norm logged after each 16-mixed step is read on the gradients the step
    unscaled (not divided by the scale a second time), and that read does not leave the next step's gradients
    scaled: norms and weights follow the fp32 run."""
    runs = {}
    for precision in ("32-true", "16-mixed"):
        torch.manual_seed(0)
        module = MLP()
        fit = Fit(_args(tmp_path, max_steps=4, logging_steps=1, max_grad_norm=0.0), precision=precision)
        fit.fit(module, _data())
        runs[precision] = ([h["grad_norm"] for h in fit.state.log_history if "grad_norm" in h],
                           torch.cat([p.detach().flatten() for p in module.parameters()]))
    norms32, weights32 = runs["32-true"]
    norms16, weights16 = runs["16-mixed"]
    assert len(norms16) == 4 and norms16 == pytest.approx(norms32, rel=5e-2) and 1e-3 < norms16[0] < 100
    assert torch.allclose(weights16, weights32, atol=1e-2)


def test_f_prec_1_bf16_mixed_keeps_fp32_master_weights(tmp_path):
    """F-PREC-1: bf16-mixed computes the forward in bf16 but weights and gradients stay fp32; bf16-true and
    16-true hold 16-bit weights and gradients."""
    for precision, out_dtype, param_dtype in (("bf16-mixed", torch.bfloat16, torch.float32),
                                              ("bf16-true", torch.bfloat16, torch.bfloat16),
                                              ("16-true", torch.float16, torch.float16)):
        cb = InjectInf(at=-1)
        module = MLP()
        # adam_epsilon 1e-8 rounds to 0 in float16, and 0/0 updates then make 16-true weights NaN (which stops
        # the run): 1e-4 is representable
        fit = Fit(_args(tmp_path, max_steps=3, adam_epsilon=1e-4), callbacks=[cb], precision=precision)
        out = fit.fit(module, _data())
        assert set(module.out_dtypes) == {out_dtype}, precision
        assert set(module.param_dtypes) == {param_dtype} and set(cb.grad_dtypes) == {param_dtype}, precision
        assert fit.strategy.precision.name == precision and out.training_loss == out.training_loss  # not nan
        assert not any("loss_scale" in h for h in fit.state.log_history)


def test_f_prec_1_hf_flags_map_onto_plugins(tmp_path):
    """F-PREC-1: fp16 -> 16-mixed, bf16 -> bf16-mixed, precision short names; fp16_full_eval / bf16_full_eval
    evaluate in 16-true / bf16-true and the next fit trains in fp32 again."""
    assert Fit(_args(tmp_path, fp16=True)).strategy.precision.name == "16-mixed"
    assert Fit(_args(tmp_path, bf16=True)).strategy.precision.name == "bf16-mixed"
    assert Fit(_args(tmp_path), precision="16-true").strategy.precision.param_dtype == torch.float16
    assert Fit(_args(tmp_path), precision="16").strategy.precision.name == "16-mixed"
    for flag, dtype in (("fp16_full_eval", torch.float16), ("bf16_full_eval", torch.bfloat16)):
        module = MLP()
        fit = Fit(_args(tmp_path, max_steps=2, **{flag: True}))
        fit.validate(module, _data(16))
        assert module.param_dtypes == [dtype, dtype] and module.net[0].weight.dtype == dtype
        module.param_dtypes.clear()
        fit.fit(module, _data())
        assert set(module.param_dtypes) == {torch.float32} and fit.strategy.precision.name == "32-true"


def test_f_prec_1_scaler_state_round_trip_and_errors():
    """F-PREC-1: the 16-mixed plugin's state (scale, skipped steps) round-trips, also into a plugin whose scaler
    is made later; bad plugin arguments fail with the valid choices."""
    p = PRECISIONS.build("16-mixed")
    p.setup_device(torch.device("cpu"))
    p.scaler.scale(torch.ones(()))
    p.scaler.update(1024.0)
    p.skipped_steps = 3
    q = MixedPrecision("16-mixed")
    q.load_state_dict(p.state_dict())
    q.setup_device(torch.device("cpu"))
    assert q.scaler.get_scale() == 1024.0 and q.skipped_steps == 3
    assert Precision().state_dict() == {} and PRECISIONS.build("bf16-mixed").state_dict() == {}
    with pytest.raises(ValueError, match=r"Unknown mixed precision '8-mixed'.*16-mixed, bf16-mixed"):
        MixedPrecision("8-mixed")
    with pytest.raises(ValueError, match="only used with precision='16-mixed'"):
        MixedPrecision("bf16-mixed", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="true-precision dtype"):
        HalfTruePrecision(torch.float32)
    with pytest.raises(ValueError, match="not supported on 'xla'"):
        MixedPrecision("16-mixed").setup_device(torch.device("xla"))


def test_f_prec_2_tf32_refused_off_cuda(tmp_path):
    """F-PREC-2: tf32=True/False on the CPU is refused at Fit(...) with a message naming the device; None is a
    no-op."""
    for value in (True, False):
        with pytest.raises(ValueError, match=r"tf32=(True|False) only applies to CUDA GPUs.*'cpu'"):
            Fit(_args(tmp_path, tf32=value))
    assert apply_tf32(None, torch.device("cpu")) is None


# ------------------------------------------------------------------------------------------------- CUDA ---
@pytest.mark.cuda
@CUDA
def test_f_prec_1_cuda_16_mixed_skips_inf_step_and_scale_drops(tmp_path):
    """F-PREC-1 / F-LOOP-8 on CUDA: GradScaler('cuda') skips the step with an injected inf, the scale halves."""
    fit, cb, module = _check_skip_on_inf(tmp_path, strategy=_cuda_strategy(MixedPrecision("16-mixed")))
    assert fit.strategy.precision.scaler._device == "cuda"  # GradScaler keeps its device private
    assert module.net[0].weight.device.type == "cuda" and set(module.out_dtypes) == {torch.float16}


@pytest.mark.cuda
@CUDA
def test_f_prec_1_cuda_bf16_mixed_and_16_mixed_train(tmp_path):
    """F-PREC-1 on CUDA: bf16-mixed and 16-mixed lower the loss with fp32 master weights; 16-mixed loss stays
    within 2 % of the fp32 loss after 20 steps."""
    losses = {}
    for name in ("32-true", "bf16-mixed", "16-mixed"):
        module = MLP()
        fit = Fit(_args(tmp_path, max_steps=20), strategy=_cuda_strategy(PRECISIONS.build(name)))
        losses[name] = fit.fit(module, _data(160)).training_loss
        assert module.net[0].weight.dtype == torch.float32 and module.net[0].weight.is_cuda
    assert losses["16-mixed"] == pytest.approx(losses["32-true"], rel=2e-2)
    assert losses["bf16-mixed"] == pytest.approx(losses["32-true"], rel=5e-2)


@pytest.mark.cuda
@CUDA
def test_f_prec_2_cuda_tf32_sets_flags(tmp_path):
    """F-PREC-2 on CUDA: tf32=True sets the matmul and cuDNN TF32 flags, tf32=False clears them, and a float32
    matmul under TF32 differs from the exact one (the switch has an effect)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        Fit(_args(tmp_path, tf32=False), strategy=_cuda_strategy(Precision()))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(1024, 1024, device="cuda", generator=g)
        exact = a @ a
        Fit(_args(tmp_path, tf32=True), strategy=_cuda_strategy(Precision()))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        fast = a @ a
        assert not torch.equal(exact, fast) and torch.allclose(exact, fast, rtol=1e-2, atol=1e-1)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
