"""The runners the overhead suite compares: a hand-written PyTorch loop, taskfit, Lightning's ``Trainer`` and
Hugging Face's ``Trainer``. Each trains a :class:`~benchmarks.workloads.Job` for ``job.steps`` optimizer steps
with the job's own optimizer (AdamW), no gradient clipping, no LR schedule (constant), no logging,
checkpointing or progress bar, in fp32, so every runner must end with the hand-written loop's exact weights.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import Skip, package_version

#: runner name -> (label, distributions that must be installed, modules imported for the import time)
RUNNERS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "raw": ("hand-written loop", (), ()),
    "taskfit": ("taskfit", (), ("taskfit",)),
    "engine": ("taskfit Engine", (), ("taskfit",)),
    "lightning": ("Lightning", ("lightning",), ("lightning.pytorch",)),
    "hf": ("HF Trainer", ("transformers", "accelerate"), ("transformers",)),
}


def _missing(name: str) -> list[str]:
    return [dist for dist in RUNNERS[name][1] if package_version(dist) is None]


def available_runners() -> tuple[list[str], dict[str, str]]:
    """``(runnable names, {skipped name: reason})``: peers run only when their package is installed (extra
    ``bench-peers``)."""
    names, skipped = [], {}
    for name, (label, _, _) in RUNNERS.items():
        missing = _missing(name)
        if missing:
            skipped[name] = f"{label}: {', '.join(missing)} not installed (pip install taskfit[bench-peers])"
        else:
            names.append(name)
    return names, skipped


def import_framework(name: str) -> float:
    """Import runner ``name``'s framework (what a user's script imports to train) and return the seconds it
    took, torch already imported."""
    start = time.perf_counter()
    if name == "taskfit":
        from taskfit import Fit, FitArguments, TaskModule  # noqa: F401  (the lazy exports load the core)
    elif name == "engine":
        from taskfit import Engine  # noqa: F401
    elif name == "lightning":
        import lightning.pytorch  # noqa: F401
    elif name == "hf":
        from transformers import Trainer, TrainingArguments  # noqa: F401
    else:
        for module in RUNNERS[name][2]:
            importlib.import_module(module)
    return time.perf_counter() - start


def _module(base: type, job: Any) -> Any:
    """An instance of a ``base`` subclass (TaskModule or LightningModule) holding ``job.net``, whose
    ``training_step`` is the job's loss and whose ``configure_optimizers`` returns the job's optimizer."""

    class BenchModule(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = job.net

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return job.loss(self.net, batch)

        def configure_optimizers(self) -> Any:
            return job.optimizer

    return BenchModule()


def run_raw(job: Any, tmp: str) -> None:
    """The reference: forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)`` per batch."""
    net, opt, loss_fn = job.net, job.optimizer, job.loss
    net.train()
    for batch in job.loader:
        loss = loss_fn(net, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_taskfit(job: Any, tmp: str) -> None:
    """``Fit(...).fit(module, loader)`` with a TaskModule whose ``configure_optimizers`` returns the job's
    optimizer (so no schedule), ``max_grad_norm=0``, logging/saving/progress bar off, ``32-true``."""
    from taskfit import Fit, FitArguments, TaskModule

    args = FitArguments(
        output_dir=os.path.join(tmp, "taskfit"),
        max_steps=job.steps,
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=job.batch_size,
        seed=0,
    )
    Fit(args, accelerator=_device_kind(job), precision="32-true").fit(_module(TaskModule, job), job.loader)


def run_engine(job: Any, tmp: str) -> None:
    """The hand-written loop on ``Engine``: ``engine.setup`` of the job's module and optimizer and
    ``setup_dataloaders`` of its loader, ``engine.backward(loss)``, the wrapped ``optimizer.step()`` and
    ``zero_grad(set_to_none=True)`` per batch, ``32-true``."""
    from taskfit import Engine

    engine = Engine(accelerator=_device_kind(job), precision="32-true")
    net, opt = engine.setup(job.net, job.optimizer)
    loader, loss_fn = engine.setup_dataloaders(job.loader), job.loss
    net.train()
    for batch in loader:
        loss = loss_fn(net, batch)
        engine.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
    engine.teardown()


def run_lightning(job: Any, tmp: str) -> None:
    """``lightning.pytorch.Trainer`` with logger, checkpointing, progress bar, model summary and sanity
    validation off; the LightningModule returns the job's optimizer."""
    import logging

    import lightning.pytorch as pl

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = pl.Trainer(
        accelerator=_device_kind(job),
        devices=1,
        max_steps=job.steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        precision="32-true",
        default_root_dir=os.path.join(tmp, "lightning"),
    )
    trainer.fit(_module(pl.LightningModule, job), train_dataloaders=job.loader)


def run_hf(job: Any, tmp: str) -> None:
    """``transformers.Trainer`` with ``optimizers=(job optimizer, None)``, ``lr_scheduler_type="constant"``,
    ``max_grad_norm=0``, logging/saving/reporting/progress bar off, the job's loader returned by
    ``get_train_dataloader``; the model wrapper returns ``{"loss": ...}`` as HF models do."""
    import torch
    from transformers import Trainer, TrainingArguments
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = job.net

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": job.loss(self.net, {"x": x, "labels": labels})}

    class BenchTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return job.loader

    args = TrainingArguments(
        output_dir=os.path.join(tmp, "hf"),
        max_steps=job.steps,
        max_grad_norm=0.0,
        learning_rate=job.optimizer.param_groups[0]["lr"],
        lr_scheduler_type="constant",
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        per_device_train_batch_size=job.batch_size,
        use_cpu=_device_kind(job) == "cpu",
        seed=0,
    )
    BenchTrainer(model=Wrapper(), args=args, optimizers=(job.optimizer, None)).train()


def _device_kind(job: Any) -> str:
    return next(job.net.parameters()).device.type


RUN: dict[str, Callable[[Any, str], None]] = {
    "raw": run_raw,
    "taskfit": run_taskfit,
    "engine": run_engine,
    "lightning": run_lightning,
    "hf": run_hf,
}


def run(name: str, job: Any, tmp: str) -> float:
    """Train ``job`` with runner ``name``; returns the wall time of the whole call in seconds (framework
    set-up, all steps, tear-down: the per-epoch time).

    Raises:
        Skip: unknown runner or its package missing.
    """
    if name not in RUN:
        raise Skip(f"unknown runner {name!r}; valid: {', '.join(RUN)}")
    missing = _missing(name)
    if missing:
        raise Skip(f"{', '.join(missing)} not installed")
    start = time.perf_counter()
    RUN[name](job, tmp)
    return time.perf_counter() - start
