"""F-MEM-1: gradient checkpointing for HF models (their switch) and any module (torch.utils.checkpoint)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from _tasks import Block, TokenModel, args, grads_after_one_step, tiny_gpt2, token_data
from taskfit import Fit
from taskfit.efficiency import disable_gradient_checkpointing, enable_gradient_checkpointing


def _is_checkpointing(model):
    flag = "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    return getattr(model, flag)


def _batch(n=4):
    data = token_data(n)
    return {k: torch.stack([d[k] for d in data]) for k in data[0]}


def test_f_mem_1_generic_layers_same_gradients_and_recompute():
    """F-MEM-1: ModuleList blocks (the default) are checkpointed: the gradients equal the run without it, each
    block's forward runs twice per step (recomputed in backward), and state-dict keys are unchanged."""
    plain, ckpt = TokenModel(), TokenModel()
    keys = list(ckpt.state_dict())
    assert enable_gradient_checkpointing(ckpt) == ["blocks.0", "blocks.1"]
    assert list(ckpt.state_dict()) == keys
    g_plain, g_ckpt = grads_after_one_step(plain, _batch()), grads_after_one_step(ckpt, _batch())
    assert g_plain.keys() == g_ckpt.keys()
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], rtol=0, atol=0)
    assert [b.calls for b in plain.blocks] == [1, 1] and [b.calls for b in ckpt.blocks] == [2, 2]
    with torch.no_grad():  # no recompute when there is no backward
        ckpt(_batch()["input_ids"])
    assert [b.calls for b in ckpt.blocks] == [3, 3]
    disable_gradient_checkpointing(ckpt)
    grads_after_one_step(ckpt, _batch())
    assert [b.calls for b in ckpt.blocks] == [4, 4]


def test_f_mem_1_named_layers_and_errors():
    """F-MEM-1: layers named by class or class name (kwargs ``layers`` or the ``gradient_checkpointing_layers``
    attribute); unknown names and options fail with the valid choices."""
    m = TokenModel()
    assert enable_gradient_checkpointing(m, {"layers": ["Linear"], "preserve_rng_state": False}) == [
        "blocks.0.ff", "blocks.1.ff", "head"]
    m2 = TokenModel()
    m2.gradient_checkpointing_layers = Block
    assert enable_gradient_checkpointing(m2) == ["blocks.0", "blocks.1"]
    with pytest.raises(ValueError, match=r"Unknown gradient checkpointing layer class 'Blok'\. Did you mean \"Block\""):
        enable_gradient_checkpointing(TokenModel(), {"layers": ["Blok"]})
    with pytest.raises(ValueError, match=r"Unknown gradient_checkpointing_kwargs key 'use_reentrnt'.*use_reentrant"):
        enable_gradient_checkpointing(TokenModel(), {"use_reentrnt": False})
    with pytest.raises(ValueError, match="found no layer to checkpoint"):
        enable_gradient_checkpointing(nn.Sequential(nn.Linear(2, 2)))


def test_f_mem_1_fit_trains_the_same_with_checkpointing(tmp_path):
    """F-MEM-1: Fit(gradient_checkpointing=True) gives the same losses as without (fp32, deterministic blocks)."""
    losses = {}
    for flag in (False, True):
        m = TokenModel()
        Fit(args(tmp_path, max_steps=4, gradient_checkpointing=flag)).fit(m, token_data())
        losses[flag] = m.losses
        assert [b.calls for b in m.blocks] == [4 * (1 + flag)] * 2
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)
    with pytest.raises(ValueError, match="gradient_checkpointing_kwargs key 'bad'"):
        Fit(args(tmp_path, gradient_checkpointing=True, gradient_checkpointing_kwargs={"bad": 1}))


def test_f_mem_1_hf_model_uses_its_own_switch():
    """F-MEM-1: a Hugging Face model is switched through gradient_checkpointing_enable (is_gradient_checkpointing)
    and its gradients equal the run without checkpointing."""
    plain = tiny_gpt2()
    ckpt = copy.deepcopy(plain)
    wrapped = nn.ModuleDict({"model": ckpt})
    assert enable_gradient_checkpointing(wrapped, {"use_reentrant": False}) == ["model"]
    assert _is_checkpointing(ckpt) and not _is_checkpointing(plain)
    batch = _batch()
    grads = []
    for m in (plain, ckpt):
        m.train()
        m(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6)
    disable_gradient_checkpointing(wrapped)
    assert not _is_checkpointing(ckpt)
