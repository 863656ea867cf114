"""``Engine`` with a bitsandbytes-quantized base: ``Engine.setup`` runs the checks ``Fit`` runs (one function,
``taskfit.core.quantized.check_quantized_setup``): full fine-tuning of a quantized model is refused as
``transformers.Trainer`` refuses it, a uint8-stored quantized base under a strategy that shards every parameter
(FSDP, ZeRO-3) is refused naming the strategy before any process starts, and a QLoRA model trains on one process (F-FT-2, F-FT-3)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from finetune_common import equal_rows  # noqa: E402
from lora_parallel_job import qlora_model  # noqa: E402
from test_qlora import nf4_llama  # noqa: E402

from taskfit import Engine  # noqa: E402


def test_engine_refuses_full_fine_tuning_of_a_quantized_model_F_FT_2(base_dir):
    """With an optimizer over the 4-bit model's own weights: the ``transformers.Trainer`` error, before any
    weight moves; without an optimizer (inference) the model is set up."""
    model = nf4_llama(base_dir)
    engine = Engine(accelerator="cpu")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.is_floating_point()], lr=0.1)
    with pytest.raises(ValueError, match="purely quantized model \\(LlamaForCausalLM, quantized with bitsandbytes"
                                         ".*get_peft_model"):
        engine.setup(model, optimizer)
    assert engine.setup(model).module is model  # evaluation only: allowed, as HF evaluates a quantized model


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_3"])
def test_engine_refuses_a_quantized_base_under_sharding_before_any_process_F_FT_3(base_dir, strategy):
    """The same error as ``Fit``'s (names the strategy, ``bnb_4bit_quant_storage`` and ``'ddp'``), raised by ``setup`` before
    ``launch()`` is even needed: no process group, no second process."""
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    model = qlora_model(base_dir)
    engine = Engine(accelerator="cpu", strategy=strategy, devices=2)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    detail = f" \\(ZeRO-{strategy[-1]}\\)" if strategy.startswith("deepspeed") else ""
    with pytest.raises(ValueError, match=f"strategy='{strategy.split('_')[0]}'{detail} cannot train a base quantized "
                                         "with bitsandbytes .*bnb_4bit_quant_storage.*strategy='ddp'"):
        engine.setup(model, optimizer)
    assert not torch.distributed.is_initialized()


def test_engine_trains_a_qlora_model_on_one_process_F_FT_2(base_dir):
    """The adapter model passes both checks and two steps change the adapter only (the 4-bit base is frozen)."""
    model = qlora_model(base_dir).train()  # from_pretrained leaves the base in eval mode; Engine, as Fabric, keeps it
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    engine = Engine(accelerator="cpu")
    module, optimizer = engine.setup(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                              lr=1e-2))
    rows = equal_rows(4)
    batch = {k: torch.tensor([r[k] for r in rows]) for k in rows[0]}
    losses = []
    for _ in range(2):
        loss = module(**batch).loss
        engine.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[n], v) for n, v in trainable.items() if "lora_B" in n)
    assert all(torch.equal(after[n], v) for n, v in frozen.items())
    assert losses[1] < losses[0]
