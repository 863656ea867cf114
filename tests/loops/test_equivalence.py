"""Equivalence tests: Fit against a hand-written loop, accumulation against the large batch (F-LOOP-2)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from taskfit import Fit, FitArguments, TaskModule
from taskfit.data.samplers import EpochRandomSampler


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), disable_tqdm=True, report_to="none", save_strategy="no",
                logging_steps=1000, seed=0)
    base.update(kw)
    return FitArguments(**base)


# kept local: a hidden layer with its own AdamW, which the hand-written loops copy step for step
class MLPModule(TaskModule):
    def __init__(self, lr=1e-3, own_optimizer=True):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.lr, self.own_optimizer = lr, own_optimizer

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr) if self.own_optimizer else None


def _data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, (x[:, :4].argmax(-1) + (x[:, 4] > 1).long()) % 4)


def test_parity_with_hand_written_loop_user_loader(tmp_path):
    """F-LOOP-1 / F-CORE-3: 50 steps through Fit equal a plain PyTorch loop bitwise (32-true, AdamW, clipping)."""
    ds = _data(200)
    torch.manual_seed(1)
    module = MLPModule()
    raw = copy.deepcopy(module.net)

    def loader():
        return DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3))

    opt = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    dl, steps = loader(), 0
    while steps < 50:
        for x, y in dl:
            loss = F.cross_entropy(raw(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            opt.step()
            steps += 1
            if steps == 50:
                break

    fit = Fit(_args(tmp_path, max_steps=50, max_grad_norm=1.0), accelerator="cpu", precision="32-true")
    out = fit.fit(module, loader())
    assert out.global_step == 50
    for (name, a), b in zip(module.net.state_dict().items(), raw.state_dict().values()):
        assert torch.equal(a, b), name
    # the optimizer state matches too
    assert torch.equal(fit.optimizer.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_parity_with_hand_written_loop_fit_built_loader(tmp_path):
    """F-LOOP-1 / F-CORE-5: with a Dataset, Fit's seeded sampler (seed + epoch) gives the same run as a plain
    loop over the same permutations; 2 epochs, bitwise equal."""
    ds = _data(200)
    torch.manual_seed(2)
    module = MLPModule()
    raw = copy.deepcopy(module.net)
    opt = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    sampler = EpochRandomSampler(len(ds), seed=7)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(ds, batch_size=8, sampler=sampler):
            loss = F.cross_entropy(raw(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    fit = Fit(_args(tmp_path, num_train_epochs=2, per_device_train_batch_size=8, max_grad_norm=0, seed=7))
    fit.fit(module, ds)
    assert fit.state.global_step == 50
    for a, b in zip(module.net.state_dict().values(), raw.state_dict().values()):
        assert torch.equal(a, b)


def _accum_run(tmp_path, module, ds, bs, accum, collator=None, epochs=2):
    args = _args(tmp_path, per_device_train_batch_size=bs, gradient_accumulation_steps=accum,
                 num_train_epochs=epochs, max_grad_norm=0, seed=5)
    fit = Fit(args)
    fit.fit(module, ds, data_collator=collator)
    return fit


def _max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_accumulation_equals_large_batch_sample_mean(tmp_path):
    """F-LOOP-2: batch 8 x accumulation 4 == batch 32 (sample-mean loss), including a short last window
    (100 samples: 3 windows of 32 and one of 4)."""
    ds = _data(100)
    torch.manual_seed(3)
    a = MLPModule()
    b = copy.deepcopy(a)
    fa = _accum_run(tmp_path / "a", a, ds, 8, 4)
    fb = _accum_run(tmp_path / "b", b, ds, 32, 1)
    assert fa.state.global_step == fb.state.global_step == 8
    assert _max_diff(a, b) < 1e-6


class TokenDataset(Dataset):
    """Variable-length token sequences; the loss is a mean over non-padding tokens."""

    def __init__(self, n=96, vocab=11, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(2, 20, (1,), generator=g))
            ids = torch.randint(1, vocab, (length,), generator=g)
            self.items.append({"input_ids": ids, "labels": (ids * 3 + 1) % vocab})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad_collate(samples):
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    labels = torch.full((len(samples), width), -100, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s["input_ids"])] = s["input_ids"]
        labels[i, : len(s["labels"])] = s["labels"]
    return {"input_ids": ids, "labels": labels}


# kept local: padded token batches whose non-ignored token counts weigh the micro-batches
class TokenModule(TaskModule):
    """Per-token model (no mixing across positions), loss = mean over labels != -100."""

    def __init__(self, equal_weights=False):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 16)
        self.head = torch.nn.Linear(16, 11)
        self.equal_weights = equal_weights

    def training_step(self, batch, batch_idx):
        logits = self.head(torch.tanh(self.emb(batch["input_ids"])))
        return F.cross_entropy(logits.reshape(-1, 11), batch["labels"].reshape(-1), ignore_index=-100)

    def num_items(self, batch):
        return None if self.equal_weights else super().num_items(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_accumulation_equals_large_batch_token_mean(tmp_path):
    """F-LOOP-2: with a token-mean loss over variable-length padded sequences, accumulation weights each
    micro-batch by its non-ignored token count, so 8 x 4 equals 32; equal weighting would not."""
    ds = TokenDataset()
    torch.manual_seed(4)
    a = TokenModule()
    b, naive = copy.deepcopy(a), copy.deepcopy(a)
    naive.equal_weights = True
    _accum_run(tmp_path / "a", a, ds, 8, 4, pad_collate)
    _accum_run(tmp_path / "b", b, ds, 32, 1, pad_collate)
    _accum_run(tmp_path / "c", naive, ds, 8, 4, pad_collate)
    assert _max_diff(a, b) < 1e-6
    # the test can fail: averaging per micro-batch gives visibly different weights
    assert _max_diff(naive, b) > 1e-4


@pytest.mark.parametrize("precision", ["64-true", "bf16-mixed", "bf16-true"])
def test_precisions_train_on_cpu(tmp_path, precision):
    """F-PREC-1 (core subset): 64-true, bf16-mixed (CPU autocast) and bf16-true train and lower the loss."""
    ds = _data(128)
    torch.manual_seed(0)
    module = MLPModule(lr=1e-2)
    x, y = ds.tensors

    def full_loss():
        with torch.no_grad():
            return F.cross_entropy(module(x.to(module.net[0].weight.dtype)).float(), y).item()

    before = full_loss()
    fit = Fit(_args(tmp_path, num_train_epochs=4, per_device_train_batch_size=16), precision=precision)
    fit.fit(module, ds)
    assert full_loss() < before - 0.1
    expected = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "bf16-mixed": torch.float32}[precision]
    assert module.net[0].weight.dtype == expected
