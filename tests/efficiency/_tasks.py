"""Small real models shared by the efficiency tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from taskfit import FitArguments, TaskModule

VOCAB, WIDTH, SEQ = 32, 16, 12


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no", logging_steps=1,
                seed=0, per_device_train_batch_size=4, learning_rate=1e-2, lr_scheduler_type="constant",
                max_grad_norm=0.0)
    base.update(kw)
    return FitArguments(**base)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Linear(WIDTH, WIDTH)
        self.calls = 0

    def forward(self, h):
        self.calls += 1
        return h + torch.tanh(self.ff(h))


# kept local: a ModuleList of blocks, the shape activation checkpointing and compile act on
class TokenModel(TaskModule):
    """(B, SEQ) ids -> next-token logits; blocks in a ModuleList."""

    def __init__(self, n_blocks=2, log_in_forward=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(n_blocks)])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.log_in_forward = log_in_forward
        self.losses = []

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        logits = self(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        self.log("train_loss", loss)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("loss", F.cross_entropy(self(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten()))


def token_data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return [{"input_ids": ids[i], "labels": (ids[i] * 7 + 3) % VOCAB} for i in range(n)]


def grads_after_one_step(module, batch):
    module.train()
    loss = F.cross_entropy(module(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten())
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in module.named_parameters()}


def tiny_gpt2():
    """A 2-layer GPT-2 built from a config (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH, n_layer=2, n_head=2, bos_token_id=0,
                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)
