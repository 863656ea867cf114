"""F-CORE-5 (data: datasets + collator -> loaders, drop_last, group_by_length, IterableDataset, DataModule,
workers) and F-REPRO-1 (seed, data_seed, full_determinism, bitwise-reproducible runs)."""

from __future__ import annotations

import os

import pytest
import torch
from taskfit import DataModule, Fit, TaskModule
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset


def _fit(tmp_path, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k in ("data_collator", "model_init", "callbacks")}
    opts.update(kwargs)
    return Fit(**opts, **extra)


class Indexed(Dataset):
    """Sample i is ``(i, features_i, target_i)``: the index tells which samples a batch holds."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return torch.tensor(i), self.x[i], self.y[i]


# kept local: records the indices, sizes and epochs each step received (dropout for the RNG tests)
class Recorder(TaskModule):
    """Linear regression (with dropout, so RNG seeding matters) that records what each step received."""

    def __init__(self, dropout: float = 0.0, init_seed: int | None = 0) -> None:
        super().__init__()
        if init_seed is not None:
            torch.manual_seed(init_seed)
        self.layer = nn.Linear(4, 1)
        self.drop = nn.Dropout(dropout)
        self.train_idx: list[list[int]] = []
        self.train_sizes: list[int] = []
        self.val_sizes: list[int] = []
        self.epochs: list[int] = []

    def forward(self, x):
        return self.layer(self.drop(x)).squeeze(-1)

    def training_step(self, batch, batch_idx):
        idx, x, y = batch
        self.train_idx.append(idx.tolist())
        self.train_sizes.append(len(idx))
        self.epochs.append(self.current_epoch)
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        idx, x, y = batch
        self.val_sizes.append(len(idx))
        return nn.functional.mse_loss(self(x), y)

    def test_step(self, batch, batch_idx):
        _idx, x, y = batch
        self.log("mse", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        _idx, x, _y = batch
        return self(x)


def _epoch_orders(module: Recorder) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for epoch, idx in zip(module.epochs, module.train_idx):
        out.setdefault(epoch, []).extend(idx)
    return out


# ------------------------------------------------------------------------------------------- loaders ---
def test_datasets_and_collator_build_loaders_with_argument_batch_sizes_F_CORE_5(tmp_path):
    """F-CORE-5: datasets become DataLoaders with ``per_device_train_batch_size`` / ``per_device_eval_batch_size``
    and the given ``data_collator``; the last partial batch is kept by default."""
    calls = []

    def collator(samples):
        calls.append(len(samples))
        return tuple(torch.stack(col) for col in zip(*samples))

    module = Recorder()
    fit = _fit(tmp_path, per_device_train_batch_size=3, per_device_eval_batch_size=5, num_train_epochs=1,
               eval_strategy="epoch", data_collator=collator)
    fit.fit(module, Indexed(10), Indexed(7))
    assert fit.train_loader.batch_size == 3 and fit._last_fit.eval_loaders[None].batch_size == 5
    assert module.train_sizes == [3, 3, 3, 1]
    assert module.val_sizes == [5, 2]
    assert calls == [3, 3, 3, 1, 5, 2]
    assert sorted(i for batch in module.train_idx for i in batch) == list(range(10))
    assert fit.state.global_step == 4


def test_dataloader_is_used_unchanged_F_CORE_5(tmp_path):
    """F-CORE-5: a DataLoader passed as data is used as given (its own batch size, no re-sampling)."""
    loader = DataLoader(Indexed(12), batch_size=4, shuffle=False)
    module = Recorder()
    fit = _fit(tmp_path, num_train_epochs=1)
    fit.fit(module, loader)
    assert fit.train_loader is loader
    assert module.train_idx == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_dataloader_drop_last_F_CORE_5(tmp_path):
    """F-CORE-5: ``dataloader_drop_last=True`` drops the incomplete last training batch of each epoch (10 samples,
    batch 3 -> 3 steps per epoch) and, as HF's ``get_eval_dataloader``, of the evaluation loader (7 samples, batch 5
    -> one batch of 5 per evaluation)."""
    module = Recorder()
    fit = _fit(tmp_path, per_device_train_batch_size=3, per_device_eval_batch_size=5, num_train_epochs=2,
               dataloader_drop_last=True, eval_strategy="epoch")
    out = fit.fit(module, Indexed(10), Indexed(7))
    assert module.train_sizes == [3] * 6 and out.global_step == 6 and fit.state.samples_seen == 18
    assert module.val_sizes == [5, 5]


# ---------------------------------------------------------------------------------------- data order ---
def _order(tmp_path, epochs: int = 1, **kwargs) -> dict[int, list[int]]:
    torch.manual_seed(999)  # disturb the global RNG: the data order must not depend on it
    module = Recorder()
    _fit(tmp_path, num_train_epochs=epochs, **kwargs).fit(module, Indexed(16))
    return _epoch_orders(module)


def test_data_order_is_a_function_of_data_seed_and_epoch_F_REPRO_1(tmp_path):
    """F-REPRO-1 / F-CORE-5: the training order is shuffled, depends on ``data_seed`` (or ``seed`` when
    ``data_seed`` is None) and on the epoch, and on nothing else."""
    a = _order(tmp_path, epochs=2, seed=1)
    b = _order(tmp_path, epochs=2, seed=1)
    assert a == b
    assert sorted(a[0]) == list(range(16)) and sorted(a[1]) == list(range(16))
    assert a[0] != list(range(16))  # shuffled
    assert a[0] != a[1]  # a new order each epoch
    assert _order(tmp_path, seed=2)[0] != a[0]  # seed drives the order when data_seed is None
    c = _order(tmp_path, seed=1, data_seed=7)
    d = _order(tmp_path, seed=5, data_seed=7)
    e = _order(tmp_path, seed=1, data_seed=8)
    assert c == d  # data_seed alone decides the order
    assert c != e and c[0] != a[0]


def test_seed_without_data_seed_changes_weights_not_only_order_F_REPRO_1(tmp_path):
    """F-REPRO-1: with a fixed ``data_seed`` the order is fixed, while ``seed`` still drives dropout: two seeds
    give the same order but different weights."""
    runs = []
    for seed in (1, 2):
        module = Recorder(dropout=0.5)
        _fit(tmp_path, num_train_epochs=1, seed=seed, data_seed=3).fit(module, Indexed(16))
        runs.append(module)
    assert runs[0].train_idx == runs[1].train_idx
    assert not torch.equal(runs[0].layer.weight, runs[1].layer.weight)


# ---------------------------------------------------------------------------------------- group_by_length ---
class Texts(Dataset):
    """Dict samples with ``input_ids`` of lengths 1..20 and a ``score`` column."""

    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(5)
        self.lengths = torch.randint(1, 21, (n,), generator=g).tolist()

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"input_ids": list(range(1, self.lengths[i] + 1)), "score": 100 - self.lengths[i], "idx": i}


def _pad(samples):
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s["input_ids"])] = torch.tensor(s["input_ids"])
    return {"input_ids": ids, "idx": torch.tensor([s["idx"] for s in samples])}


# kept local: padded token batches whose lengths and padding the grouping tests count
class TokenModule(TaskModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(21, 2)
        self.lengths: list[list[int]] = []
        self.padding = 0

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        lens = (ids != 0).sum(-1)
        self.lengths.append(lens.tolist())
        self.padding += int((ids == 0).sum())
        return self.emb(ids).pow(2).mean()


def test_group_by_length_groups_similar_lengths_F_CORE_5(tmp_path):
    """F-CORE-5: ``group_by_length`` puts similar lengths together (here one mega-batch: longest first), so the
    padding is far smaller than with random batches; every sample is still seen once per epoch."""
    grouped = TokenModule()
    _fit(tmp_path, num_train_epochs=1, per_device_train_batch_size=4, group_by_length=True,
         data_collator=_pad).fit(grouped, Texts())
    flat = [n for batch in grouped.lengths for n in batch]
    assert sorted(flat) == sorted(Texts().lengths)
    assert flat == sorted(flat, reverse=True)
    plain = TokenModule()
    _fit(tmp_path, num_train_epochs=1, per_device_train_batch_size=4, data_collator=_pad).fit(plain, Texts())
    assert grouped.padding < plain.padding / 3


def test_group_by_length_uses_length_column_F_CORE_5(tmp_path):
    """F-CORE-5: ``length_column_name`` names a precomputed length column that is used instead of input_ids
    (here ``score = 100 - length``, so the order comes out shortest first)."""
    module = TokenModule()
    _fit(tmp_path, num_train_epochs=1, per_device_train_batch_size=4, group_by_length=True,
         length_column_name="score", data_collator=_pad).fit(module, Texts())
    flat = [n for batch in module.lengths for n in batch]
    assert flat == sorted(flat)


def test_group_by_length_needs_lengths_F_CORE_5(tmp_path):
    """F-CORE-5: ``group_by_length`` on samples without input_ids or the length column -> clear ValueError."""
    with pytest.raises(ValueError, match="group_by_length=True needs a 'length' or 'input_ids'"):
        _fit(tmp_path, max_steps=1, group_by_length=True).fit(Recorder(), Indexed(8))


# ------------------------------------------------------------------------------------- IterableDataset ---
class Stream(IterableDataset):
    """8 samples per pass; records ``set_epoch`` calls and reshuffles per epoch."""

    def __init__(self) -> None:
        self.epoch = 0
        self.epochs_set: list[int] = []
        self.data = Indexed(8)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self):
        order = torch.randperm(8, generator=torch.Generator().manual_seed(self.epoch))
        return (self.data[int(i)] for i in order)


def test_iterable_dataset_trains_with_max_steps_F_CORE_5(tmp_path):
    """F-CORE-5: an IterableDataset trains for exactly ``max_steps`` optimizer steps, passing over the stream
    as many times as needed and calling ``set_epoch`` before each pass (4 batches per pass, 10 steps)."""
    stream = Stream()
    module = Recorder()
    out = _fit(tmp_path, max_steps=10).fit(module, stream)
    assert out.global_step == 10 and len(module.train_idx) == 10
    assert stream.epochs_set == [0, 1, 2]
    orders = _epoch_orders(module)
    assert sorted(orders[0]) == list(range(8)) and orders[0] != orders[1]


def test_iterable_dataset_without_max_steps_errors_F_CORE_5(tmp_path):
    """F-CORE-5: without ``max_steps`` an IterableDataset cannot be planned: ValueError saying so."""
    with pytest.raises(ValueError, match="no length.*set max_steps"):
        _fit(tmp_path).fit(Recorder(), Stream())


# ------------------------------------------------------------------------------------------ DataModule ---
class Data(DataModule):
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.prepared = 0

    def prepare_data(self):
        self.prepared += 1

    def setup(self, stage):
        self.stages.append(stage)

    def train_dataloader(self):
        return Indexed(12)  # a Dataset: FitArguments batch sizes apply

    def val_dataloader(self):
        return DataLoader(Indexed(6), batch_size=3)

    def test_dataloader(self):
        return Indexed(5)

    def predict_dataloader(self):
        return DataLoader(Indexed(7), batch_size=4)


def test_datamodule_for_fit_validate_test_predict_F_CORE_5(tmp_path):
    """F-CORE-5: a ``DataModule`` supplies the data of fit (with its val loader for evaluation), validate, test
    and predict; ``prepare_data`` and ``setup(stage)`` run for each."""
    dm = Data()
    module = Recorder()
    fit = _fit(tmp_path, num_train_epochs=1, eval_strategy="epoch", per_device_train_batch_size=4)
    fit.fit(module, datamodule=dm)
    assert module.train_sizes == [4, 4, 4] and module.val_sizes == [3, 3]
    metrics = fit.validate(datamodule=dm)
    assert "eval_loss" in metrics and module.val_sizes == [3, 3, 3, 3]
    test = fit.test(datamodule=dm)
    assert "test_mse" in test
    with torch.no_grad():
        data = Indexed(5)
        expected = nn.functional.mse_loss(module(data.x), data.y)
    # batches of 2, 2, 1: the epoch value is the batch-size-weighted mean of the per-batch MSEs == overall MSE
    assert test["test_mse"] == pytest.approx(float(expected), rel=1e-5)
    pred = fit.predict(datamodule=dm)
    assert pred.predictions.shape == (7,)
    assert dm.stages == ["fit", "validate", "test", "predict"] and dm.prepared == 4


# ---------------------------------------------------------------------------------- reproducibility ---
def _train_weights(tmp_path, dropout: float = 0.3, **kwargs) -> dict[str, torch.Tensor]:
    torch.manual_seed(2024)  # a different global RNG state before each run: Fit must reseed
    module = Recorder(dropout=dropout)
    _fit(tmp_path, num_train_epochs=2, learning_rate=0.05, **kwargs).fit(module, Indexed(24))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_gives_bitwise_equal_weights_F_REPRO_1(tmp_path):
    """F-REPRO-1: two runs with the same seed end with bitwise-equal weights (dropout + shuffling); another
    seed gives other weights."""
    a = _train_weights(tmp_path, seed=11)
    b = _train_weights(tmp_path, seed=11)
    c = _train_weights(tmp_path, seed=12)
    assert _equal(a, b)
    assert not _equal(a, c)


def test_num_workers_gives_same_weights_F_CORE_5(tmp_path):
    """F-CORE-5 / F-MEM-4: ``dataloader_num_workers=2`` loads the same batches in the same order as 0 workers:
    bitwise-equal final weights."""
    a = _train_weights(tmp_path, dropout=0.0, seed=3)
    b = _train_weights(tmp_path, dropout=0.0, seed=3, dataloader_num_workers=2)
    assert _equal(a, b)


def test_full_determinism_runs_F_REPRO_1(tmp_path, monkeypatch):
    """F-REPRO-1: ``full_determinism=True`` turns on deterministic algorithms and the CUBLAS workspace setting,
    trains, and gives the same weights as the default mode on CPU."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        a = _train_weights(tmp_path, seed=5, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
    finally:
        torch.use_deterministic_algorithms(was)
    b = _train_weights(tmp_path, seed=5)
    assert _equal(a, b)


def test_model_init_is_seeded_F_REPRO_1(tmp_path):
    """F-REPRO-1: as in HF (``set_seed(args.seed)`` before ``model_init``), a model built by ``model_init`` gets
    the same initial weights in every run with the same seed, whatever the global RNG state was."""

    def model_init():
        return Recorder(init_seed=None)  # initial weights drawn from the global RNG

    weights = []
    for disturb in (1, 2):
        torch.manual_seed(disturb)
        fit = _fit(tmp_path, max_steps=2, seed=7, model_init=model_init)
        fit.fit(None, Indexed(8))
        weights.append(fit.model.layer.weight.detach().clone())
    assert torch.equal(weights[0], weights[1])


def test_construction_seeds_as_hf_trainer_init_and_lightning_trainer_does_not_F_REPRO_1(tmp_path):
    """F-REPRO-1: ``Fit(...)`` seeds ``torch``, ``random`` and ``numpy`` with ``args.seed`` as HF's
    ``Trainer.__init__`` does (``set_seed(args.seed)``), so a model built after it is the same whatever the random
    state was; Lightning's ``Trainer`` constructor leaves the random state alone, and so does the Lightning door's."""
    import random

    import numpy as np
    from taskfit.lightning import Trainer as LightningTrainer
    from transformers import set_seed

    set_seed(7)
    want = (torch.rand(3), random.random(), np.random.rand())
    for disturb in (1, 2):
        torch.manual_seed(disturb)
        random.seed(disturb)
        np.random.seed(disturb)
        _fit(tmp_path, seed=7)
        got = (torch.rand(3), random.random(), np.random.rand())
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
    torch.manual_seed(1)
    state = torch.get_rng_state()
    LightningTrainer(default_root_dir=str(tmp_path / "lit"), logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
    assert torch.equal(torch.get_rng_state(), state)


def test_taskmodule_that_handles_raw_strings_trains_F_CORE_5(tmp_path):
    """F-CORE-5 / F-CORE-1: a TaskModule may receive non-tensor batches (here lists of strings it tokenises
    itself, as Lightning allows); the loop must not fail on counting the samples of such a batch."""

    # kept local: its batches are lists of strings, not tensors
    class CharModel(TaskModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(128, 2)

        def training_step(self, batch, batch_idx):
            ids = torch.tensor([[ord(c) % 128 for c in s[:3]] for s in batch])
            return self.emb(ids).pow(2).mean()

    fit = _fit(tmp_path, max_steps=3)
    assert fit.fit(CharModel(), ["abc", "def", "ghi", "jkl"] * 2).global_step == 3
    assert fit.state.samples_seen == 6
