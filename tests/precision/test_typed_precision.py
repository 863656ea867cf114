"""The per-strategy precision plugins (FSDP, DeepSpeed, XLA) behave as the plain plugin of the same name and add
what their strategy needs (F-PREC-3)."""

import contextlib

import pytest
import torch

from taskfit.precision import PRECISIONS, DeepSpeedPrecision, FSDPPrecision, XLAPrecision


@pytest.mark.parametrize("name", ["32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"])
def test_fsdp_precision_matches_the_plain_plugin(name):
    plain, fsdp = PRECISIONS.build(name), FSDPPrecision(name)
    assert fsdp.name == name
    assert (fsdp.param_dtype, fsdp.autocast_dtype, fsdp.loss_scaling, fsdp.compute_dtype) == \
        (plain.param_dtype, plain.autocast_dtype, plain.loss_scaling, plain.compute_dtype)
    module = torch.nn.Linear(2, 2)
    fsdp.convert_module(module)
    assert module.weight.dtype == (plain.param_dtype or torch.float32)
    x = torch.randn(3, 2, dtype=module.weight.dtype)
    with fsdp.forward_context("cpu"):
        out = module(x)
    assert out.dtype == (plain.autocast_dtype or plain.param_dtype or torch.float32)
    if plain.autocast_dtype is None:
        assert isinstance(fsdp.forward_context("cpu"), contextlib.nullcontext)
    policy = fsdp.mixed_precision_policy()
    assert policy.param_dtype == plain.autocast_dtype
    assert policy.reduce_dtype == (torch.float32 if plain.autocast_dtype else None)


def test_fsdp_precision_16_mixed_scales_and_a_given_policy_wins():
    p = FSDPPrecision("16-mixed")
    p.setup_device(torch.device("cpu"))
    assert p.scaler is not None and p.loss_scaling
    given = object()
    assert FSDPPrecision("bf16-mixed", policy=given).mixed_precision_policy() is given
    with pytest.raises(ValueError, match="only used with precision='16-mixed', got precision='bf16-true'"):
        FSDPPrecision("bf16-true", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="Unknown FSDPPrecision precision 'bf16'"):
        FSDPPrecision("bf16")


def test_deepspeed_precision_leaves_numerics_to_the_engine():
    p = DeepSpeedPrecision("bf16-mixed")
    assert (p.engine_half, p.engine_dtype, p.param_dtype, p.autocast_dtype) == ("bf16", torch.bfloat16, None, None)
    assert p.compute_dtype == torch.bfloat16 and not p.loss_scaling
    batch = {"x": torch.ones(2), "ids": torch.ones(2, dtype=torch.long)}
    assert p.convert_input(batch)["x"].dtype == torch.float32  # the engine does not exist yet
    p.active = True
    out = p.convert_input(batch)
    assert out["x"].dtype == torch.bfloat16 and out["ids"].dtype == torch.long
    assert DeepSpeedPrecision("32-true").engine_dtype is None
    with pytest.raises(ValueError, match="precision='64-true' is not supported by DeepSpeed"):
        DeepSpeedPrecision("64-true")


def test_xla_precision_names():
    assert XLAPrecision("bf16-mixed").autocast_dtype == torch.bfloat16
    assert XLAPrecision("bf16-true").param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'16-mixed' is not supported on 'xla' devices"):
        XLAPrecision("16-mixed")
