"""F-LOOP-4 (remaining optimizers) and F-MEM-5: Adafactor, bitsandbytes 8-bit, Lion, optim_target_modules, and
the optimizer-state arithmetic of the memory estimate, measured against real optimizer state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from taskfit import FitArguments, estimate_memory
from taskfit.efficiency.estimate import optimizer_state_bytes
from taskfit.optim.optimizers import _require, create_optimizer

HAS_BNB = True
try:
    import bitsandbytes  # noqa: F401
except ImportError:  # pragma: no cover - the extra is in [test]
    HAS_BNB = False
HAS_LION = True
try:
    import lion_pytorch  # noqa: F401
except ImportError:  # pragma: no cover
    HAS_LION = False
needs_bnb = pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (pip install 'taskfit[bnb]')")
needs_lion = pytest.mark.skipif(not HAS_LION, reason="lion-pytorch is not installed (pip install 'taskfit[lion]')")


class Net(nn.Module):
    """~100k parameters: two large matrices (8-bit state), small ones and a norm (32-bit state, no decay)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(256, 256)
        self.norm = nn.LayerNorm(256)
        self.b = nn.Linear(256, 128)
        self.c = nn.Linear(128, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.norm(self.a(x)))))


def _state_bytes(opt):
    return sum(t.nbytes for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))


def _one_step(name, optim_args=None, **kw):
    model = Net()
    opt = create_optimizer(model, FitArguments(optim=name, optim_args=optim_args, learning_rate=1e-3, **kw))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(4, 256)).square().mean().backward()
    opt.step()
    changed = all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return model, opt, changed


MEASURED = ["adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"]
MEASURED += [n for n in ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "lion_8bit", "lion_32bit",
                         "ademamix_8bit", "rmsprop_bnb_8bit") if HAS_BNB]
MEASURED += ["lion"] if HAS_LION else []


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
@pytest.mark.parametrize("name", MEASURED)
def test_f_mem_5_estimate_optimizer_state_is_exact(name):
    """F-MEM-5 / F-LOOP-4: every optimizer trains (all parameters move after one step) and the estimate's
    optimizer-state bytes equal the bytes of the real state tensors after that step."""
    optim_args = {"sgd": "momentum=0.9", "rmsprop": "momentum=0.9,centered=True"}.get(name)
    model, opt, changed = _one_step(name, optim_args)
    assert changed
    measured = _state_bytes(opt)
    est = estimate_memory(model, FitArguments(optim=name, optim_args=optim_args))
    assert est.optimizer_state == measured > 0
    n = sum(p.numel() for p in model.parameters())
    assert est.parameters == est.gradients == 4 * n


def test_f_loop_4_adafactor_and_8bit_state_smaller_than_adamw():
    """F-LOOP-4: measured state bytes: AdamW ~8 B/param; Adafactor far less (factored); 8-bit AdamW ~2 B/param;
    Lion ~4 B/param; SGD with momentum 4 B/param."""
    n = sum(p.numel() for p in Net().parameters())
    adamw = _state_bytes(_one_step("adamw_torch")[1])
    assert adamw == pytest.approx(8 * n, rel=1e-3)
    adafactor = _state_bytes(_one_step("adafactor")[1])
    assert adafactor < adamw / 20
    assert _state_bytes(_one_step("sgd", "momentum=0.9")[1]) == 4 * n
    if HAS_BNB:
        eight = _state_bytes(_one_step("adamw_bnb_8bit")[1])
        assert eight < adamw / 3 and eight == pytest.approx(2 * n, rel=0.15)
    if HAS_LION:
        assert _state_bytes(_one_step("lion")[1]) == 4 * n


@needs_bnb
def test_f_loop_4_bnb_classes_and_hf_arguments():
    """F-LOOP-4: HF's bitsandbytes names map to the right class, bits and paging; betas/eps from the arguments and
    optim_args (ademamix beta3/alpha)."""
    import bitsandbytes as bnb

    cases = {"adamw_bnb_8bit": (bnb.optim.AdamW, 8, False), "paged_adamw_32bit": (bnb.optim.AdamW, 32, True),
             "lion_32bit": (bnb.optim.Lion, 32, False), "rmsprop_bnb": (bnb.optim.RMSprop, 32, None)}
    for name, (cls, bits, paged) in cases.items():
        opt = create_optimizer(Net(), FitArguments(optim=name, adam_beta2=0.95))
        assert isinstance(opt, cls) and opt.args.optim_bits == bits, name
        if paged is not None:
            assert opt.is_paged == paged
        if name != "rmsprop_bnb":
            assert opt.param_groups[0]["betas"] == (0.9, 0.95)
    opt = create_optimizer(Net(), FitArguments(optim="ademamix_8bit", optim_args="beta3=0.999,alpha=4.0"))
    assert opt.param_groups[0]["betas"] == (0.9, 0.999, 0.999) and opt.param_groups[0]["alpha"] == 4.0


def test_f_loop_4_missing_package_names_the_extra():
    """F-LOOP-4: a missing optional package raises ModuleNotFoundError naming the extra to install."""
    with pytest.raises(ModuleNotFoundError, match=r"optim='adamw_bnb_8bit' needs the 'no-such-pkg-x' package: "
                                                  r"pip install 'taskfit\[bnb\]'"):
        _require("no-such-pkg-x", "bnb", "adamw_bnb_8bit")


def test_f_loop_4_optim_args_and_target_modules():
    """F-LOOP-4: optim_args reach HF's Adafactor (unknown keys are refused with the accepted list);
    optim_target_modules is refused for optimizers that ignore it and an HF name taskfit does not build is
    reported as not supported."""
    opt = create_optimizer(Net(), FitArguments(optim="adafactor", optim_args={"decay_rate": -0.7, "eps": (1e-30, 0.01)}))
    assert opt.param_groups[0]["decay_rate"] == -0.7 and opt.param_groups[0]["eps"] == (1e-30, 0.01)
    with pytest.raises(TypeError, match=r"optim_args \['momentum'\] are not accepted by optim='adafactor'"):
        create_optimizer(Net(), FitArguments(optim="adafactor", optim_args="momentum=0.9"))
    with pytest.raises(ValueError, match=r"optim_target_modules=\['attn'\] is only read by the GaLore/APOLLO"):
        create_optimizer(Net(), FitArguments(optim="adamw_torch", optim_target_modules=["attn"]))
    with pytest.raises(NotImplementedError, match="optim='adamw_anyprecision' is not supported by taskfit"):
        create_optimizer(Net(), FitArguments(optim="adamw_anyprecision"))
    with pytest.raises(ValueError, match="optimizer for the memory estimate"):
        optimizer_state_bytes("lomo", torch.zeros(3))


def test_f_loop_4_user_optimizer_still_used(tmp_path):
    """F-LOOP-4: an optimizer passed in (HF optimizers=(opt, None)) is the one that steps, whatever ``optim`` says."""
    from torch.utils.data import TensorDataset

    from taskfit import Fit

    model = Net()
    mine = torch.optim.SGD(model.parameters(), lr=0.1)
    fit = Fit(FitArguments(output_dir=str(tmp_path), optim="adafactor", max_steps=2, report_to="none",
                           disable_tqdm=True, save_strategy="no"), optimizers=(mine, None))

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x, labels):
            return {"loss": nn.functional.cross_entropy(self.m(x), labels)}

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(16, 256, generator=g), torch.randint(0, 10, (16,), generator=g))
    fit.fit(Wrapped(), [{"x": x, "labels": y} for x, y in ds])
    assert fit.optimizer is mine and mine.state == {}  # plain SGD keeps no state, but it stepped:
    assert fit.state.global_step == 2


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("name", ["adamw_torch_fused"] + (["adamw_bnb_8bit", "paged_adamw_8bit"] if HAS_BNB else []))
def test_f_loop_4_cuda_fused_and_8bit_train_and_state_is_exact(name):
    """F-LOOP-4 / F-MEM-5 on CUDA: adamw_torch_fused and bitsandbytes 8-bit AdamW (paged too) lower the loss of a
    regression over 30 steps; their measured state bytes equal the estimate; 8-bit state < AdamW's / 3."""
    torch.manual_seed(0)
    model = Net().cuda()
    opt = create_optimizer(model, FitArguments(optim=name, learning_rate=1e-3))
    x = torch.randn(64, 256, device="cuda")
    y = torch.randn(64, 10, device="cuda")
    losses = []
    for _ in range(30):
        loss = (model(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0]
    measured = _state_bytes(opt)
    assert estimate_memory(model, FitArguments(optim=name)).optimizer_state == measured
    n = sum(p.numel() for p in model.parameters())
    if "8bit" in name:
        assert measured < 8 * n / 3
    else:
        assert opt.defaults["fused"] is True
