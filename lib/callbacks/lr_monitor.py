"""Learning-rate (and momentum, weight decay) series per optimizer and parameter group (mirrors Lightning's
``LearningRateMonitor``: its names, its order and its checks)."""

from __future__ import annotations

import itertools
import warnings
from collections import defaultdict
from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.errors import configuration_error


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer / parameter group at the step it applies to.

    Names follow Lightning: a scheduler's ``name`` (from ``configure_optimizers``) or ``lr-{OptimizerClass}``,
    with ``-{n}`` for a further optimizer of the same class, ``/{group name}`` for a named parameter group
    (``{"params": ..., "name": "linear"}``) or ``/pg{i}`` (1-based) when an optimizer has several unnamed groups;
    optimizers with a scheduler come first. ``-momentum`` (``betas[0]`` for Adam-like optimizers, 0 without
    momentum, with a RuntimeWarning) and ``-weight_decay`` series are added on request. Values are logged at
    ``on_train_batch_start`` of the first micro-batch of a window, with the step index of the coming optimizer
    step (Lightning's numbering), every ``logging_steps`` steps; with ``logging_interval="epoch"`` at each epoch
    start; with None step-interval schedules per step and the others per epoch. The HF-style ``learning_rate``
    key of the training log rows keeps its own meaning (the rate after the step).

    Args:
        logging_interval (str | None): ``"step"``, ``"epoch"`` or None.
        log_momentum (bool): also log the momentum.
        log_weight_decay (bool): also log the weight decay.

    Attributes:
        lrs (dict[str, list[float]]): every logged learning-rate value per name, in order (as Lightning's).
        last_momentum_values (dict[str, float | None]), last_weight_decay_values (dict[str, float | None]): the
            latest values per ``{name}-momentum`` / ``{name}-weight_decay`` (None before the first).

    Raises:
        ValueError: bad ``logging_interval``; at the start of training, two parameter groups of one optimizer with
            the same ``name`` (Lightning's messages; Lightning raises its ``MisconfigurationException``).
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise configuration_error("logging_interval should be `step` or `epoch` or `None`.")  # Lightning's words
        self.logging_interval, self.log_momentum, self.log_weight_decay = logging_interval, log_momentum, \
            log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, Any] = {}
        self.last_weight_decay_values: dict[str, Any] = {}
        self._last_step = -1
        self._windows = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        run = trainer.run
        if self.log_momentum and _lacks(run, "momentum") and _lacks(run, "betas"):
            warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log "
                          "a value 0 for the momentum.", RuntimeWarning, stacklevel=2)  # Lightning's words
        names, seen, types = self._names_from_schedulers(run.schedulers)
        names += self._names_from_optimizers(run.optimizers, seen, types)[0]
        flat = list(itertools.chain.from_iterable(names))
        self.lrs = {name: [] for name in flat}
        self.last_momentum_values = {f"{name}-momentum": None for name in flat}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in flat}
        self._last_step = -1

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        st = trainer.state
        manual = not pl_module.automatic_optimization
        if not manual and st.global_step == self._last_step:
            return  # another micro-batch of the same window
        if self._last_step < 0:  # windows done before this one (batches under manual optimization, which may
            # step several optimizers: Lightning's _batches_that_stepped), also after a resume
            self._windows = st.global_step if not manual or not st.batches_per_epoch else \
                st.current_epoch * st.batches_per_epoch + st.batch_in_epoch
        self._last_step, done = st.global_step, self._windows
        self._windows += 1
        if self.logging_interval != "epoch" and (done + 1) % max(1, st.logging_steps) == 0:  # log_every_n_steps
            self._send(trainer, self._stats(trainer, "step" if self.logging_interval is None else "any"), done)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.logging_interval != "step":
            self._send(trainer, self._stats(trainer, "epoch" if self.logging_interval is None else "any"),
                       trainer.state.global_step)

    def _send(self, fit: Any, values: dict[str, float], step: int) -> None:
        if not values:
            return
        fit.logged_metrics.update(values)
        fit.callback_metrics.update(values)
        if fit.is_global_zero:
            for lg in fit.loggers:
                lg.log_metrics(dict(values), step)

    def _stats(self, fit: Any, interval: str) -> dict[str, float]:
        """Lightning's ``_extract_stats``: the scheduled optimizers whose interval matches, then those without a
        scheduler (always)."""
        out: dict[str, float] = {}
        configs = fit.run.schedulers
        names, seen, types = self._names_from_schedulers(configs)
        self._remap(names)
        for group_names, cfg in zip(names, configs):
            if interval in (cfg.interval, "any"):
                out.update(self._optimizer_stats(cfg.scheduler.optimizer, group_names))
        names, unscheduled = self._names_from_optimizers(fit.run.optimizers, seen, types)
        self._remap(names)
        for opt, group_names in zip(unscheduled, names):
            out.update(self._optimizer_stats(opt, group_names))
        return out

    def _optimizer_stats(self, optimizer: Any, names: list[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        betas = "betas" in getattr(optimizer, "defaults", {})
        for group, name in zip(optimizer.param_groups, names):
            out[name] = group["lr"]
            self.lrs.setdefault(name, []).append(group["lr"])
            if self.log_momentum:
                m = group["betas"][0] if betas else group.get("momentum", 0)
                out[f"{name}-momentum"] = self.last_momentum_values[f"{name}-momentum"] = m
            if self.log_weight_decay:
                wd = group["weight_decay"]
                out[f"{name}-weight_decay"] = self.last_weight_decay_values[f"{name}-weight_decay"] = wd
        return out

    def _remap(self, names: list[list[str]], token: str = "/pg1") -> None:
        """A series keeps its values when its optimizer gained parameter groups (``lr-SGD`` -> ``lr-SGD/pg1``)."""
        for group_names in names:
            for new in group_names:
                old = new.replace(token, "")
                if token in new and old in self.lrs:
                    self.lrs[new] = self.lrs.pop(old)
                elif new not in self.lrs:
                    self.lrs[new] = []

    def _names_from_schedulers(self, configs: list[Any]) -> tuple[list[list[str]], list[Any], defaultdict]:
        names: list[list[str]] = []
        seen: list[Any] = []
        types: defaultdict = defaultdict(int)
        for cfg in configs:
            opt = cfg.scheduler.optimizer
            name = cfg.name if getattr(cfg, "name", None) is not None else f"lr-{type(opt).__name__}"
            names.append(self._group_names(opt, name, seen, types, named=getattr(cfg, "name", None) is not None))
        return names, seen, types

    def _names_from_optimizers(self, optimizers: list[Any], seen: list[Any],
                               types: defaultdict) -> tuple[list[list[str]], list[Any]]:
        names, unscheduled = [], []
        for opt in optimizers:
            opt = getattr(opt, "optimizer", opt)  # a wrapped optimizer: the torch one inside
            if any(opt is s for s in seen):
                continue
            names.append(self._group_names(opt, f"lr-{type(opt).__name__}", seen, types, named=False))
            unscheduled.append(opt)
        return names, unscheduled

    @staticmethod
    def _group_names(opt: Any, name: str, seen: list[Any], types: defaultdict, named: bool) -> list[str]:
        """Lightning's ``_check_duplicates_and_update_name``: the names of ``opt``'s parameter groups."""
        seen.append(opt)
        if not named:
            types[type(opt)] += 1
        groups = opt.param_groups
        labels = [g.get("name", f"pg{i}") for i, g in enumerate(groups, start=1)]
        duplicates = {n for n in labels if labels.count(n) > 1}
        if duplicates:
            raise configuration_error("A single `Optimizer` cannot have multiple parameter groups with identical "
                                      f"`name` values. {name} has duplicated parameter group names {duplicates}")
        count = types.get(type(opt), 0)
        name = f"{name}-{count - 1}" if count > 1 else name
        if len(groups) > 1:
            return [f"{name}/{g.get('name', f'pg{i + 1}')}" for i, g in enumerate(groups)]
        return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]


def _lacks(run: Any, key: str) -> bool:
    """Lightning's check: some scheduled optimizer (or, without schedulers, some optimizer) has no ``key``
    default."""
    if run.schedulers:
        return any(key not in c.scheduler.optimizer.defaults for c in run.schedulers)
    return any(key not in getattr(o, "defaults", {}) for o in run.optimizers)
