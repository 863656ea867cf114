"""F-LOOP-4: optimizers by name (``optim``, ``optim_args``) and the weight-decay parameter groups."""

from __future__ import annotations

import enum
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from taskfit.optim.optimizers import OPTIMIZERS, create_optimizer, get_decay_parameter_names, parse_optim_args

#: HF names taskfit cannot build (each raises NotImplementedError with the reason)
HF_PENDING = [
    "adamw_hf",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adamw_apex_fused",
    "adamw_anyprecision",
]


def make_args(**overrides):
    base = {
        "optim": "adamw_torch",
        "optim_args": None,
        "learning_rate": 3e-4,
        "weight_decay": 0.1,
        "adam_beta1": 0.85,
        "adam_beta2": 0.97,
        "adam_epsilon": 1e-6,
    }
    base.update(overrides)
    return SimpleNamespace(**base)


class MyRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.bn = nn.BatchNorm1d(4)
        self.rms = MyRMSNorm(4)
        self.head = nn.Linear(4, 2, bias=False)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, idx):
        x = self.ln(self.lin(self.emb(idx))).reshape(-1, 4)  # (batch * length, 4) for BatchNorm1d
        return self.head(self.rms(self.bn(x)))


DECAY = {"emb.weight", "lin.weight", "head.weight"}
NO_DECAY = {"lin.bias", "ln.weight", "ln.bias", "bn.weight", "bn.bias", "rms.weight"}


def group_names(model, opt):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [{by_id[id(p)] for p in g["params"]} for g in opt.param_groups]


# ----------------------------------------------------------------------------------------------- decay groups
def test_f_loop_4_decay_parameter_names_excludes_bias_and_norms():
    """F-LOOP-4: biases, LayerNorm, BatchNorm and a custom *Norm class get no decay; frozen params still
    listed."""
    names = set(get_decay_parameter_names(Net()))
    assert names == DECAY | {"frozen.weight"}


def test_f_loop_4_decay_parameter_names_torch_norm_types_and_name_patterns():
    """F-LOOP-4: GroupNorm, InstanceNorm, RMSNorm by type (any attribute name); HF name patterns on raw
    params."""
    model = nn.Module()
    model.g = nn.GroupNorm(2, 4)
    model.i = nn.InstanceNorm1d(4, affine=True)
    model.r = nn.RMSNorm(4)
    model.conv = nn.Conv1d(4, 4, 3)
    model.register_parameter("attn_norm", nn.Parameter(torch.ones(4)))
    model.register_parameter("extra_bias", nn.Parameter(torch.zeros(4)))
    model.register_parameter("scale", nn.Parameter(torch.ones(4)))
    model.block = nn.Module()
    model.block.norm = nn.Module()  # a plain container named "norm": HF's "(^|.)norm(.|$)" pattern
    model.block.norm.register_parameter("gamma", nn.Parameter(torch.ones(4)))

    class T5LayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

    model.final = T5LayerNorm()
    assert get_decay_parameter_names(model) == ["scale", "conv.weight"]


def test_f_loop_4_decay_parameter_names_rejects_non_module():
    with pytest.raises(TypeError, match="nn.Module"):
        get_decay_parameter_names({"w": torch.zeros(1)})


def test_f_loop_4_create_optimizer_param_groups():
    """F-LOOP-4: two groups, decay group with weight_decay, no-decay group with 0.0; counts add up; frozen
    skipped."""
    model = Net()
    opt = create_optimizer(model, make_args(weight_decay=0.25))
    assert len(opt.param_groups) == 2
    assert group_names(model, opt) == [DECAY, NO_DECAY]
    assert opt.param_groups[0]["weight_decay"] == 0.25
    assert opt.param_groups[1]["weight_decay"] == 0.0
    trainable = [p for p in model.parameters() if p.requires_grad]
    in_groups = [p for g in opt.param_groups for p in g["params"]]
    assert len(in_groups) == len(trainable) == 9
    assert sum(p.numel() for p in in_groups) == sum(p.numel() for p in trainable)
    assert len({id(p) for p in in_groups}) == len(in_groups)
    assert all(p is not model.frozen.weight and p is not model.frozen.bias for p in in_groups)


def test_f_loop_4_empty_groups_dropped_and_no_trainable_params_error():
    opt = create_optimizer(nn.Linear(3, 3, bias=False), make_args())
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.1
    opt = create_optimizer(nn.LayerNorm(3), make_args())  # only no-decay parameters
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 0.0
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        create_optimizer(frozen, make_args())


def test_f_loop_4_weight_decay_applies_only_to_decay_group():
    """F-LOOP-4: one SGD step with zero gradients shrinks decay params by (1 - lr*wd) and leaves the rest."""
    model = Net()
    opt = create_optimizer(model, make_args(optim="sgd", learning_rate=0.1, weight_decay=0.5))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        if n in DECAY:
            torch.testing.assert_close(p.detach(), before[n] * (1 - 0.1 * 0.5))
        else:
            torch.testing.assert_close(p.detach(), before[n])


# ------------------------------------------------------------------------------------------------ optimizers
def test_f_loop_4_adamw_torch_hyperparameters():
    model = Net()
    opt = create_optimizer(model, make_args())
    assert type(opt) is torch.optim.AdamW
    for group, wd in zip(opt.param_groups, (0.1, 0.0)):
        assert group["lr"] == 3e-4
        assert group["betas"] == (0.85, 0.97)
        assert group["eps"] == 1e-6
        assert group["weight_decay"] == wd
        assert not group["fused"]
        assert group["foreach"] is None  # torch picks foreach where supported
    assert opt.defaults["weight_decay"] == 0.1


def test_f_loop_4_adamw_torch_fused_matches_unfused_on_cpu():
    """F-LOOP-4: adamw_torch_fused builds AdamW(fused=True) on CPU and takes the same step as adamw_torch."""
    torch.manual_seed(0)
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    opt_a = create_optimizer(a, make_args(optim="adamw_torch", learning_rate=1e-2))
    opt_b = create_optimizer(b, make_args(optim="adamw_torch_fused", learning_rate=1e-2))
    assert type(opt_b) is torch.optim.AdamW
    assert all(g["fused"] is True for g in opt_b.param_groups)
    assert opt_b.param_groups[0]["betas"] == (0.85, 0.97) and opt_b.param_groups[1]["weight_decay"] == 0.0
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for model, opt in ((a, opt_a), (b, opt_b)):
        model.train()
        for _ in range(3):
            opt.zero_grad()
            model(idx).pow(2).mean().backward()
            opt.step()
    # LayerNorm weights in front of BatchNorm get near-zero gradients, where Adam's m / sqrt(v) amplifies the
    # different summation order of the fused kernel; compare those loosely and the rest tightly
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        loose = n.startswith("ln.")
        torch.testing.assert_close(pa, pb, rtol=1e-3 if loose else 1e-5, atol=1e-3 if loose else 1e-6, msg=n)
    assert not torch.equal(a.lin.weight, Net().lin.weight)


def test_f_loop_4_adamw_torch_fused_unsupported_device_is_value_error():
    with pytest.raises(ValueError, match=r"adamw_torch_fused.*meta.*adamw_torch"):
        create_optimizer(nn.Linear(2, 2, device="meta"), make_args(optim="adamw_torch_fused"))
    with pytest.raises(ValueError, match="complex64"):
        create_optimizer(nn.Linear(2, 2, dtype=torch.complex64), make_args(optim="adamw_torch_fused"))


def test_f_loop_4_sgd_with_optim_args():
    model = Net()
    opt = create_optimizer(
        model, make_args(optim="sgd", learning_rate=0.05, optim_args="momentum=0.9, nesterov=True")
    )
    assert type(opt) is torch.optim.SGD
    assert opt.defaults["momentum"] == 0.9 and opt.defaults["nesterov"] is True
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.05]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert "betas" not in opt.defaults and "eps" not in opt.defaults


def test_f_loop_4_adagrad_and_rmsprop():
    model = Net()
    opt = create_optimizer(
        model, make_args(optim="adagrad", learning_rate=0.02, optim_args="lr_decay=0.01,eps=1e-9")
    )
    assert type(opt) is torch.optim.Adagrad
    assert opt.defaults["lr"] == 0.02 and opt.defaults["lr_decay"] == 0.01 and opt.defaults["eps"] == 1e-9
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    opt = create_optimizer(
        model, make_args(optim="rmsprop", learning_rate=0.01, optim_args={"alpha": 0.95, "centered": True})
    )
    assert type(opt) is torch.optim.RMSprop
    assert opt.defaults["alpha"] == 0.95 and opt.defaults["centered"] is True and opt.defaults["lr"] == 0.01
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_f_loop_4_optim_args_override_betas_lr_and_weight_decay():
    model = Net()
    opt = create_optimizer(
        model, make_args(optim_args="betas=(0.8,0.9),lr=0.5,weight_decay=0.3,amsgrad=true")
    )
    g0, g1 = opt.param_groups
    assert g0["betas"] == (0.8, 0.9) and g0["lr"] == 0.5 and g0["amsgrad"] is True
    assert g0["weight_decay"] == 0.3 and g1["weight_decay"] == 0.0
    opt = create_optimizer(model, make_args(optim_args="beta2=0.95"))
    assert opt.param_groups[0]["betas"] == (0.85, 0.95)


def test_f_loop_4_optim_args_unknown_key_names_it_and_accepted():
    with pytest.raises(TypeError, match=r"\['betas'\].*'sgd'.*momentum"):
        create_optimizer(Net(), make_args(optim="sgd", optim_args="betas=(0.9,0.9)"))
    with pytest.raises(ValueError, match="'oops'"):
        create_optimizer(Net(), make_args(optim_args="oops"))


def test_f_loop_4_optim_enum_like_value():
    class OptimizerNames(enum.Enum):
        SGD = "sgd"

    opt = create_optimizer(Net(), make_args(optim=OptimizerNames.SGD))
    assert type(opt) is torch.optim.SGD


@pytest.mark.parametrize("name", HF_PENDING)
def test_f_loop_4_pending_names_raise_not_implemented(name):
    assert name in OPTIMIZERS
    with pytest.raises(NotImplementedError, match=rf"optim='{name}' is not supported by taskfit: "):
        create_optimizer(Net(), make_args(optim=name))


def test_f_loop_4_registry_names():
    built = OPTIMIZERS.names(include_pending=False)
    assert {"adagrad", "adamw_torch", "adamw_torch_fused", "rmsprop", "sgd", "adafactor", "lion", "adamw_bnb_8bit",
            "adamw_8bit", "paged_adamw_8bit", "lion_8bit", "lion_32bit", "rmsprop_bnb", "ademamix"} <= set(built)
    assert not set(HF_PENDING) & set(built)
    assert set(HF_PENDING) <= set(OPTIMIZERS.names())


def test_f_loop_4_unknown_optimizer_did_you_mean():
    with pytest.raises(
        ValueError, match=r'Unknown optimizer \'adamw_torh\'\. Did you mean "adamw_torch"\?'
    ) as err:
        create_optimizer(Net(), make_args(optim="adamw_torh"))
    assert "sgd" in str(err.value)  # the valid choices are listed


# ------------------------------------------------------------------------------------------------ optim_args
def test_f_loop_4_parse_optim_args_values():
    parsed = parse_optim_args(
        " a=1, b=0.9,betas=(0.9, 0.95),c=True,d=FALSE,e=none,f=hello,g=1e-3,h=-2,i='x,y',j=inf"
    )
    assert parsed == {
        "a": 1,
        "b": 0.9,
        "betas": (0.9, 0.95),
        "c": True,
        "d": False,
        "e": None,
        "f": "hello",
        "g": 0.001,
        "h": -2,
        "i": "x,y",
        "j": math.inf,
    }
    assert type(parsed["a"]) is int and type(parsed["b"]) is float
    assert parse_optim_args("momentum=0.9,") == {"momentum": 0.9}


def test_f_loop_4_parse_optim_args_passthrough_and_empty():
    src = {"momentum": 0.9}
    out = parse_optim_args(src)
    assert out == src and out is not src
    assert parse_optim_args(None) == {} and parse_optim_args("") == {} and parse_optim_args("  ") == {}


@pytest.mark.parametrize(
    "bad, message",
    [
        ("a=1,b", r"piece 'b'"),
        ("=1", r"piece '=1'"),
        ("a=", r"piece 'a='"),
        ("a=1,a=2", r"piece 'a=2'.*given twice"),
        ("a=(1,2", r"unbalanced brackets or quotes in 'a=\(1,2'"),
        ("a=1)", r"'a=1\)'.*unbalanced '\)'"),
        ("1a=3", r"piece '1a=3'.*not a valid argument name"),
        ("b=[1,", r"unbalanced.*'b=\[1,'"),
    ],
)
def test_f_loop_4_parse_optim_args_errors(bad, message):
    """F-LOOP-4: bad optim_args syntax raises ValueError naming the bad piece."""
    with pytest.raises(ValueError, match=message):
        parse_optim_args(bad)


def test_f_loop_4_parse_optim_args_type_errors():
    with pytest.raises(TypeError, match="int"):
        parse_optim_args(5)
    with pytest.raises(TypeError, match="keys must be str"):
        parse_optim_args({1: 2})
