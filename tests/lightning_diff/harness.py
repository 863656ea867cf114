"""Run one Lightning-style module body under ``lightning.Trainer`` and under ``taskfit.Fit``.

A scenario is a function ``make(base)`` returning a subclass of ``base`` (``lightning.LightningModule`` or
``taskfit.TaskModule``); only the base class changes. Trainer options are given in Lightning's names and mapped to
``FitArguments`` by :data:`OPTION_MAP` (the documented mapping in docs/lightning.md).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

OPTION_MAP = {"max_epochs": "num_train_epochs", "max_steps": "max_steps",
              "accumulate_grad_batches": "gradient_accumulation_steps", "gradient_clip_val": "max_grad_norm",
              "log_every_n_steps": "logging_steps"}


def regression(n: int, dim: int = 4, seed: int = 0, noise: float = 0.1) -> TensorDataset:
    """``n`` samples ``x ~ N(0, 1)^dim`` with target ``x.sum(1, keepdim=True) + noise * N(0, 1)`` (generator seeded
    with ``seed``, drawn in that order)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + noise * torch.randn(n, 1, generator=g))


def data(n: int = 16, dim: int = 4, batch_size: int = 4, seed: int = 0) -> DataLoader:
    """A fixed, unshuffled loader of :func:`regression` (the same batches in both frameworks)."""
    return DataLoader(regression(n, dim, seed), batch_size=batch_size, shuffle=False)


def linear(base: type) -> type:
    """The scenarios' smallest module body on ``base``: ``layer = Linear(4, 1)`` regressing the :func:`data` targets
    with MSE, optimised by ``SGD(lr=0.1)``. Scenarios subclass it and override what they test."""

    class Linear(base):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Linear


def build(make: Callable[[type], type], base: type, *args: Any, seed: int = 0, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    return make(base)(*args, **kwargs)


def run_lightning(make: Callable[[type], type], train: Any, val: Any = None, *, init: dict | None = None,
                  callbacks: list | None = None, fit_kwargs: dict | None = None, quiet: bool = True,
                  logger: Any = False, **options: Any) -> tuple[Any, Any]:
    import lightning as L

    module = build(make, L.LightningModule, **(init or {}))
    opts = dict(max_epochs=1, max_steps=-1, accumulate_grad_batches=1, gradient_clip_val=None)
    opts.update(options)
    trainer = L.Trainer(accelerator="cpu", devices=1, enable_progress_bar=False, logger=logger,
                        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=callbacks or [], **opts)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        trainer.fit(module, train, val, **(fit_kwargs or {}))
    return module, trainer


def run_taskfit(make: Callable[[type], type], train: Any, val: Any = None, *, tmp_path: Any, init: dict | None = None,
                callbacks: list | None = None, fit_options: dict | None = None, fit_kwargs: dict | None = None,
                **options: Any) -> tuple[Any, Any]:
    from taskfit import Fit, TaskModule

    module = build(make, TaskModule, **(init or {}))
    fa: dict[str, Any] = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no",
                              max_grad_norm=0.0, num_train_epochs=1, logging_steps=1,
                              eval_strategy="epoch" if val is not None else "no")
    for k, v in options.items():
        if v is not None:
            fa[OPTION_MAP[k]] = v
    fa.update(fit_options or {})
    fit = Fit(callbacks=callbacks or [], **fa)
    fit.fit(module, train, val, **(fit_kwargs or {}))
    return module, fit


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def recording_logger() -> Any:
    """A Lightning logger keeping every ``log_metrics`` call as ``(step, {name: float})`` in ``.rows``."""
    from lightning.pytorch.loggers import Logger

    class Recorder(Logger):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int, dict[str, float]]] = []

        @property
        def name(self) -> str:
            return "recorder"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics: dict, step: int | None = None) -> None:
            self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

    return Recorder()
