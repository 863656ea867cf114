"""Tuning runs (mirror Lightning's ``Tuner``): the learning-rate range test (``lr_find``: train a few steps with a
rate growing from ``min_lr`` to ``max_lr``, suggest the rate where the smoothed loss falls fastest) and the
batch-size finder (``scale_batch_size``: the largest batch that trains without running out of memory). The
module's weights are the same before and after both."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from taskfit.callbacks.base import Callback


class _ExponentialLR(LRScheduler):
    """``min_lr * (max_lr / min_lr) ** (i / num_iter)`` at step ``i`` (Lightning's range-test schedule)."""

    def __init__(self, optimizer: Any, end_lr: float, num_iter: int) -> None:
        self.end_lr, self.num_iter = end_lr, num_iter
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        r = (self.last_epoch + 1) / self.num_iter
        return [b * (self.end_lr / b) ** r for b in self.base_lrs] if self.last_epoch > 0 else list(self.base_lrs)


class _LinearLR(_ExponentialLR):
    """``min_lr + (i / num_iter) * (max_lr - min_lr)`` at step ``i``."""

    def get_lr(self) -> list[float]:
        r = (self.last_epoch + 1) / self.num_iter
        return [b + r * (self.end_lr - b) for b in self.base_lrs] if self.last_epoch > 0 else list(self.base_lrs)


class LRFinder:
    """The result of :func:`lr_find`.

    Attributes:
        results (dict[str, list[float]]): ``"lr"`` (the rate of each step) and ``"loss"`` (the smoothed loss
            after it, exponential moving average with bias correction, beta 0.98).
    """

    def __init__(self, mode: str, min_lr: float, max_lr: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, min_lr, max_lr, num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate at the steepest descent of the smoothed loss over the rate (``torch.gradient`` with the rates as
        spacing, the first ``skip_begin`` and last ``skip_end`` points left out, non-finite losses dropped), as
        Lightning; None with fewer than 2 points."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end])
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            self._optimal_idx = None
            return None
        grads = torch.gradient(losses, spacing=[lrs])[0]
        idx = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(idx[int(torch.argmin(grads))])
        return self.results["lr"][self._optimal_idx]

    def plot(self, path: str | None = None, suggest: bool = True) -> Any:
        """Loss against rate (log scale for the exponential mode), the suggestion marked; written as PNG to
        ``path`` when given. Returns the matplotlib figure.

        Raises:
            ModuleNotFoundError: matplotlib missing (extra ``plots``).
        """
        from taskfit.loggers.logger import require

        require("matplotlib", "plots", "Plotting the learning-rate finder")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            i = self._optimal_idx
            ax.plot(self.results["lr"][i], self.results["loss"][i], markersize=10, marker="o", color="red")
        if path:
            fig.savefig(path, format="png")
        plt.close(fig)
        return fig


class _FinderCallback(Callback):
    def __init__(self, finder: LRFinder, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.finder, self.threshold, self.beta = finder, early_stop_threshold, beta
        self.avg_loss, self.best_loss, self._last_start, self._last_end = 0.0, 0.0, -1, -1

    def on_train_start(self, fit: Any, module: Any) -> None:
        from taskfit.optim.configure import SchedulerConfig

        run, f = fit.run, self.finder
        if len(run.optimizers) != 1:
            raise ValueError(f"lr_find works with one optimizer; the module configured {len(run.optimizers)}.")
        opt = run.optimizers[0]
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"] = f.lr_min
        cls = _LinearLR if f.mode == "linear" else _ExponentialLR
        run.schedulers = [SchedulerConfig(cls(opt, f.lr_max, f.num_training), "step")]

    def on_train_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if step != self._last_start:  # first micro-batch of a window: the rate this step uses
            self._last_start = step
            self.finder.results["lr"].append(fit.run.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if step == self._last_end:
            return  # not the end of a window
        self._last_end = step
        loss = outputs["loss"] if isinstance(outputs, Mapping) else outputs
        current = float(loss.detach())
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * current
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        if self.threshold is not None and step > 1 and smoothed > self.threshold * self.best_loss:
            fit.control.should_training_stop = True  # diverged
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.finder.results["loss"].append(smoothed)


def lr_find(fit: Any, module: Any, train_data: Any, min_lr: float = 1e-8, max_lr: float = 1.0,
            num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
            update_attr: bool = False, attr_name: str = "") -> LRFinder:
    """Learning-rate range test with ``fit``'s arguments (mirrors Lightning's ``Tuner.lr_find``): ``num_training``
    optimizer steps of the module's single optimizer with the rate rising from ``min_lr`` to ``max_lr``; stops
    early when the smoothed loss exceeds ``early_stop_threshold`` x its best. No evaluation, checkpoints or
    loggers; the module's weights (parameters and buffers) are restored exactly afterwards, and ``fit`` is not
    changed.

    Args:
        fit (Fit): gives the arguments (batch size, accumulation, clipping, precision, devices).
        module (TaskModule | nn.Module): the model.
        train_data (Dataset | DataLoader): training data.
        min_lr (float), max_lr (float): the range (``0 < min_lr < max_lr``).
        num_training (int): steps (>= 2).
        mode (str): ``"exponential"`` or ``"linear"``.
        early_stop_threshold (float | None): divergence factor; None never stops early.
        update_attr (bool): set the suggestion on ``module.<attr_name>`` (``lr`` or ``learning_rate`` when
            empty) and, when the module has neither, on ``fit.args.learning_rate``.

    Returns:
        LRFinder: ``results``, ``suggestion()``, ``plot(path)``.

    Raises:
        ValueError: bad range, ``num_training`` or ``mode``; a module with several optimizers.
    """
    from taskfit.fit.fit import Fit

    if not 0 < min_lr < max_lr:
        raise ValueError(f"lr_find needs 0 < min_lr < max_lr, got min_lr={min_lr!r}, max_lr={max_lr!r}.")
    if not isinstance(num_training, int) or num_training < 2:
        raise ValueError(f"lr_find num_training={num_training!r} must be an int >= 2.")
    if mode not in ("exponential", "linear"):
        raise ValueError(f"lr_find mode={mode!r} is not valid; choose 'exponential' or 'linear'.")
    finder = LRFinder(mode, min_lr, max_lr, num_training)
    args = dataclasses.replace(fit.args, max_steps=num_training, eval_strategy="no", save_strategy="no",
                               load_best_model_at_end=False, report_to="none", push_to_hub=False,
                               resume_from_checkpoint=None, disable_tqdm=True, eval_on_start=False,
                               num_sanity_val_steps=0, fast_dev_run=False)
    saved = copy.deepcopy(module.state_dict())
    try:
        Fit(args, callbacks=[_FinderCallback(finder, early_stop_threshold)]).fit(module, train_data)
    finally:
        module.load_state_dict(saved)
    lr = finder.suggestion()
    if update_attr and lr is not None:
        names = [attr_name] if attr_name else [n for n in ("lr", "learning_rate") if hasattr(module, n)]
        if names:
            setattr(module, names[0], lr)
        else:
            fit.args.learning_rate = lr
    return finder


def scale_batch_size(fit: Any, module: Any, train_data: Any, mode: str = "power", steps_per_trial: int = 3,
                     init_val: int = 2, max_trials: int = 25) -> int:
    """The largest ``per_device_train_batch_size`` that trains ``steps_per_trial`` steps without an out-of-memory
    error (mirrors Lightning's ``Tuner.scale_batch_size``). ``"power"`` doubles from ``init_val`` until a trial
    fails or the batch holds the whole dataset; ``"binsearch"`` then bisects between the last success and the
    failure. Each trial is a fresh run with ``fit``'s arguments (no evaluation, checkpoints or loggers); the
    module's weights and buffers are restored exactly after every trial, and ``fit.args.per_device_train_batch_size``
    is set to the result.

    Returns:
        int: the batch size found.

    Raises:
        ValueError: bad ``mode``, ``steps_per_trial``, ``init_val`` or ``max_trials``.
        torch.OutOfMemoryError: already at ``init_val`` (nothing fits), or any other error of a trial.
    """
    from taskfit.efficiency.batch_size import is_out_of_memory, release_memory
    from taskfit.fit.fit import Fit

    if mode not in ("power", "binsearch"):
        raise ValueError(f"scale_batch_size mode={mode!r} is not valid; choose 'power' or 'binsearch'.")
    for name, v in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"scale_batch_size {name}={v!r} must be an int >= 1.")
    try:
        limit: int | None = len(train_data.dataset if hasattr(train_data, "dataset") else train_data)
    except TypeError:
        limit = None
    saved = copy.deepcopy(module.state_dict())

    def fits(size: int) -> bool:
        args = dataclasses.replace(fit.args, per_device_train_batch_size=size, max_steps=steps_per_trial,
                                   eval_strategy="no", save_strategy="no", load_best_model_at_end=False,
                                   report_to="none", push_to_hub=False, resume_from_checkpoint=None,
                                   disable_tqdm=True, eval_on_start=False, num_sanity_val_steps=0,
                                   auto_find_batch_size=False, profiler=None)
        try:
            Fit(args).fit(module, train_data)
            return True
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            release_memory()
            return False
        finally:
            module.load_state_dict(saved)

    size, good, bad = init_val, None, None
    for _ in range(max_trials):
        if fits(size):
            good = size
            if limit is not None and size >= limit:
                break  # the whole dataset in one batch: larger sizes change nothing
            if bad is None:
                size *= 2
            elif mode == "power" or bad - good <= 1:
                break
            else:
                size = (good + bad) // 2
        else:
            bad = size
            if good is None:
                if size == 1:
                    raise torch.OutOfMemoryError("scale_batch_size: out of memory already at batch size 1.")
                size = max(1, size // 2)
                continue
            if mode == "power" or bad - good <= 1:
                break
            size = (good + bad) // 2
    if good is None:
        raise torch.OutOfMemoryError(f"scale_batch_size: no batch size from {init_val} down fit in memory within "
                                     f"{max_trials} trials.")
    if limit is not None:
        good = min(good, limit)
    fit.args.per_device_train_batch_size = good
    return good
