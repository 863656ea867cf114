"""Learning-rate (and momentum) series per optimizer and parameter group (mirrors Lightning's
``LearningRateMonitor``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from taskfit.callbacks.base import Callback


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer / parameter group at the step it applies to.

    Names follow Lightning: ``lr-{OptimizerClass}``, ``lr-{OptimizerClass}/pg{i}`` (1-based) when an optimizer has
    several groups, ``-{n}`` suffixes for further optimizers of the same class, ``lr-{OptimizerClass}-momentum``
    for the momentum (``betas[0]`` for Adam-like optimizers). Values are logged at ``on_train_batch_start`` of
    the first micro-batch of a window, with the step index of the coming optimizer step (Lightning's numbering),
    every ``logging_steps`` steps; with ``logging_interval="epoch"`` at each epoch start. The HF-style
    ``learning_rate`` key of the training log rows keeps its own meaning (the rate after the step).

    Args:
        logging_interval (str | None): ``"step"``, ``"epoch"`` or None (step-interval schedules per step, the
            others per epoch).
        log_momentum (bool): also log the momentum.
        log_weight_decay (bool): also log the weight decay (``lr-{Class}-weight_decay``).

    Attributes:
        lrs (dict[str, list[float]]): every logged learning-rate value per name, in order (as Lightning's).
        last_momentum_values (dict[str, float]): the latest momentum values.

    Raises:
        ValueError: bad ``logging_interval``.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ValueError(f"LearningRateMonitor logging_interval={logging_interval!r} is not valid; choose "
                             "'step', 'epoch' or None.")
        self.logging_interval, self.log_momentum, self.log_weight_decay = logging_interval, log_momentum, \
            log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float] = {}
        self._last_step = -1

    def on_train_start(self, fit: Any, module: Any) -> None:
        self.lrs = {name: [] for name in self._names(fit.run.optimizers)}
        self._last_step = -1
        self._step_interval = {id(c.scheduler.optimizer) for c in fit.run.schedulers
                               if c.interval == "step" and hasattr(c.scheduler, "optimizer")}

    @staticmethod
    def _prefixes(optimizers: list[Any]) -> list[str]:
        counts: Counter[str] = Counter()
        out = []
        for opt in optimizers:
            name = type(opt).__name__
            out.append(f"lr-{name}" + (f"-{counts[name]}" if counts[name] else ""))
            counts[name] += 1
        return out

    def _names(self, optimizers: list[Any]) -> list[str]:
        names = []
        for prefix, opt in zip(self._prefixes(optimizers), optimizers):
            groups = opt.param_groups
            names += [prefix] if len(groups) == 1 else [f"{prefix}/pg{i + 1}" for i in range(len(groups))]
        return names

    def _values(self, fit: Any, which: str) -> dict[str, float]:
        out: dict[str, float] = {}
        optimizers = fit.run.optimizers
        for prefix, opt in zip(self._prefixes(optimizers), optimizers):
            if self.logging_interval is None:
                per_step = id(opt) in self._step_interval
                if (which == "step") != per_step:
                    continue
            groups = opt.param_groups
            for i, g in enumerate(groups):
                name = prefix if len(groups) == 1 else f"{prefix}/pg{i + 1}"
                out[name] = float(g["lr"])
                self.lrs.setdefault(name, []).append(out[name])
                if self.log_momentum:
                    m = g["betas"][0] if "betas" in g else g.get("momentum", 0.0)
                    out[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = float(m)
                if self.log_weight_decay:
                    out[f"{name}-weight_decay"] = float(g.get("weight_decay", 0.0))
        return out

    def _send(self, fit: Any, values: dict[str, float], step: int) -> None:
        if not values:
            return
        fit.logged_metrics.update(values)
        fit.callback_metrics.update(values)
        if fit.is_global_zero:
            for lg in fit.loggers:
                lg.log_metrics(dict(values), step)

    def on_train_batch_start(self, fit: Any, module: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if self.logging_interval == "epoch" or step == self._last_step:
            return  # another micro-batch of the same window
        self._last_step = step
        if (step + 1) % max(1, fit.state.logging_steps) == 0:  # Lightning's log_every_n_steps rule
            self._send(fit, self._values(fit, "step"), step)

    def on_train_epoch_start(self, fit: Any, module: Any) -> None:
        if self.logging_interval != "step":
            self._send(fit, self._values(fit, "epoch"), fit.state.global_step)
