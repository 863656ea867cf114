"""F-LOOP-8 (logging_nan_inf_filter), F-CORE-5/F-MEM-4 (group_by_length) and F-MEM-3 (the example's attention)."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import torch
import torch.nn.functional as F

from _tasks import TokenModel, args, token_data
from taskfit import Fit


class NanAtStep(TokenModel):
    """Returns a NaN loss (still differentiable) on optimizer step ``at``."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.fit.state.global_step == self.at else loss


def test_f_loop_8_nan_inf_filter_keeps_logged_loss_finite(tmp_path):
    """F-LOOP-8: with logging_nan_inf_filter (default) a NaN step loss is replaced by the running mean in the
    logged loss; with the filter off the logged loss is NaN."""
    import pytest

    from taskfit.loops.finite import NonFiniteError

    logged = {}
    for flag in (True, False):
        fit = Fit(args(tmp_path, max_steps=4, logging_steps=4, logging_nan_inf_filter=flag, learning_rate=0.0))
        with pytest.raises(NonFiniteError, match="global step 4"):  # the NaN gradients made the weights NaN
            fit.fit(NanAtStep(at=2), token_data())
        logged[flag] = [h["loss"] for h in fit.state.log_history if "loss" in h][0]  # logged before the stop
    assert math.isfinite(logged[True]) and 3.0 < logged[True] < 4.0  # ~ln(32) for the untrained model
    assert math.isnan(logged[False])


def test_f_mem_4_group_by_length_reduces_padding(tmp_path):
    """F-CORE-5 / F-MEM-4: group_by_length batches samples of similar length (from length_column_name): the
    padded tokens per epoch drop compared with random batches."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 40, (256,), generator=g).tolist()
    data = [{"input_ids": torch.ones(n, dtype=torch.long), "labels": torch.ones(n, dtype=torch.long), "n": n}
            for n in lengths]

    def collate(items):
        width = max(it["n"] for it in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        for i, it in enumerate(items):
            ids[i, :it["n"]] = it["input_ids"]
        return {"input_ids": ids, "labels": ids}

    padding = {}
    for flag in (False, True):
        fit = Fit(args(tmp_path, max_steps=1, per_device_train_batch_size=8, group_by_length=flag,
                       length_column_name="n"))
        loader = fit._loader(data, train=True, collator=collate, what="train dataset")
        padding[flag] = sum(int((b["input_ids"] == 0).sum()) for b in loader)
    assert padding[True] < padding[False] / 3


def test_f_mem_3_example_attention_runs_through_sdpa():
    """F-MEM-3: the char LM example's attention (nn.TransformerEncoderLayer) calls scaled_dot_product_attention
    once per layer in a training forward (evaluation may take PyTorch's fused encoder fast path instead)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "char_lm.py"
    spec = importlib.util.spec_from_file_location("taskfit_example_char_lm_sdpa", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    net = mod.CharTransformer(vocab_size=20, block_size=16, width=32, layers=2, heads=4)
    calls = []
    original = F.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(k.get("is_causal"))
        return original(*a, **k)

    F.scaled_dot_product_attention = spy
    try:
        net.train()
        net(torch.zeros(2, 16, dtype=torch.long)).sum().backward()
        assert len(calls) == 2
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, 16, dtype=torch.long))
    finally:
        F.scaled_dot_product_attention = original
    assert len(calls) >= 2  # eval: SDPA again or the fused fast path, both flash/mem-efficient kernels


class OverflowsAtStep(TokenModel):
    """Its first block's weights become inf before optimizer step ``at`` (a diverged update)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def training_step(self, batch, batch_idx):
        if self.fit.state.global_step == self.at:
            with torch.no_grad():
                self.blocks[0].ff.weight[0, 0] = float("inf")
        return super().training_step(batch, batch_idx)


def test_f_loop_8_debug_underflow_overflow_names_the_module(tmp_path):
    """F-LOOP-8: debug="underflow_overflow" stops at the first module whose weights turn inf and names it, with
    the last frames' abs min/max; without it the run stops at the next logging step naming only the parameter
    (F-REL-5)."""
    import pytest

    with pytest.raises(ValueError, match=r"inf/NaN detected in the weights of blocks\.0\.ff \(Linear\)") as err:
        Fit(args(tmp_path, max_steps=4, debug="underflow_overflow")).fit(OverflowsAtStep(at=2), token_data())
    report = str(err.value).splitlines()
    assert report[1].startswith("emb (Embedding): weights [") and report[-1].startswith("blocks.0.ff (Linear)")
    from taskfit.loops.finite import NonFiniteError

    module = OverflowsAtStep(at=2)
    fit = Fit(args(tmp_path, max_steps=4))
    with pytest.raises(NonFiniteError, match=r"global step 3: parameter '[\w.]+' holds NaN or inf"):
        fit.fit(module, token_data())
    assert fit.state.global_step == 3 and math.isfinite(module.losses[2])
    assert not torch.isfinite(module.blocks[0].ff.weight).all()
