"""Storage for values logged with ``TaskModule.log``: last value per step, running aggregate per epoch.

Values stay tensors (detached, on their device) until the loop emits them on a logging step, so logging
costs no host sync on steps where nothing is written (DESIGN.md hot-path rule).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_REDUCE_FX = ("mean", "sum", "max", "min")


class LoggedValue:
    """One logged name: options plus the last value and the epoch aggregate."""

    __slots__ = ("name", "on_step", "on_epoch", "prog_bar", "logger", "reduce_fx", "sync_dist", "last",
                 "agg", "weight", "metric", "fresh")

    def __init__(self, name: str, on_step: bool, on_epoch: bool, prog_bar: bool, logger: bool, reduce_fx: str,
                 sync_dist: bool) -> None:
        self.name, self.on_step, self.on_epoch = name, on_step, on_epoch
        self.prog_bar, self.logger, self.reduce_fx, self.sync_dist = prog_bar, logger, reduce_fx, sync_dist
        self.last: Any = None
        self.agg: Any = None
        self.weight = 0
        self.metric = None  # a torchmetrics.Metric logged as an object: computed and reset per epoch
        self.fresh = False  # logged since the last emission


def _to_float(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


class ResultCollection:
    """Everything logged during one stage (``"train"``, ``"validate"``, ``"test"``, ``"predict"``).

    Args:
        batch_size_fn (Callable[[Any], int]): infers a batch's size, used to weight epoch means.
        reduce_fn (Callable | None): ``(tensor, op) -> tensor`` across processes for ``sync_dist=True``.
    """

    def __init__(self, batch_size_fn: Callable[[Any], int], reduce_fn: Callable | None = None) -> None:
        self.values: dict[str, LoggedValue] = {}
        self.batch_size_fn = batch_size_fn
        self.reduce_fn = reduce_fn
        self.batch: Any = None
        self._batch_size: int | None = None
        self._pending_metric_states: dict[str, dict[str, Any]] = {}  # from a checkpoint, applied on the next log

    def set_batch(self, batch: Any) -> None:
        """Record the current batch; its size is inferred only if an ``on_epoch`` mean needs it."""
        self.batch = batch
        self._batch_size = None

    def log(self, name: str, value: Any, *, on_step: bool, on_epoch: bool, prog_bar: bool, logger: bool,
            reduce_fx: str, sync_dist: bool, batch_size: int | None) -> None:
        """Store ``value`` (a number, a scalar tensor or a ``torchmetrics.Metric``) under ``name``.

        Raises:
            ValueError: ``reduce_fx`` unknown, or a tensor with more than one element.
        """
        entry = self.values.get(name)
        if entry is None:
            if reduce_fx not in _REDUCE_FX:
                raise ValueError(f"reduce_fx={reduce_fx!r} is not valid for {name!r}; choose one of {_REDUCE_FX}.")
            entry = self.values[name] = LoggedValue(name, on_step, on_epoch, prog_bar, logger, reduce_fx, sync_dist)
        if hasattr(value, "compute") and hasattr(value, "update"):  # torchmetrics.Metric: compute at epoch end
            entry.metric, entry.fresh = value, True
            if name in self._pending_metric_states:
                for k, v in self._pending_metric_states.pop(name).items():
                    setattr(value, k, v)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"self.log({name!r}, ...) needs a scalar, got a tensor of shape {tuple(value.shape)}.")
            value = value.detach().reshape(())
        entry.last, entry.fresh = value, True
        if not on_epoch:
            return
        if reduce_fx == "mean":
            if batch_size is None:
                if self._batch_size is None:
                    self._batch_size = self.batch_size_fn(self.batch)
                batch_size = self._batch_size
            contrib = value * batch_size
            entry.agg = contrib if entry.agg is None else entry.agg + contrib
            entry.weight += batch_size
        elif entry.agg is None:
            entry.agg = value
        elif reduce_fx == "sum":
            entry.agg = entry.agg + value
        else:
            pick = torch.maximum if reduce_fx == "max" else torch.minimum
            entry.agg = pick(torch.as_tensor(entry.agg), torch.as_tensor(value))

    def _sync(self, entry: LoggedValue, value: Any) -> Any:
        if entry.sync_dist and self.reduce_fn is not None:
            op = entry.reduce_fx
            value = self.reduce_fn(torch.as_tensor(value, dtype=torch.float64), op)
        return value

    def step_values(self, prog_bar_only: bool = False) -> dict[str, float]:
        """Floats of the ``on_step`` values logged since the last call with ``logger=True`` (or, with
        ``prog_bar_only``, those with ``prog_bar=True``); the host sync happens here."""
        out = {}
        for e in self.values.values():
            if not e.fresh or not e.on_step or e.last is None or (prog_bar_only and not e.prog_bar) or (
                    not prog_bar_only and not e.logger):
                continue
            key = f"{e.name}_step" if e.on_epoch else e.name
            out[key] = _to_float(self._sync(e, e.last))
        if not prog_bar_only:
            for e in self.values.values():
                e.fresh = False
        return out

    def epoch_values(self, logger_only: bool = False) -> dict[str, float]:
        """Floats of the ``on_epoch`` aggregates (``name_epoch`` when also ``on_step``)."""
        out = {}
        for e in self.values.values():
            if logger_only and not e.logger:
                continue
            key = f"{e.name}_epoch" if e.on_step else e.name
            if e.metric is not None:
                v = e.metric.compute()
                out[key] = _to_float(v)
            elif e.on_epoch and e.agg is not None:
                agg = self._sync(e, e.agg)
                if e.reduce_fx == "mean":
                    w = self._sync(e, float(e.weight)) if e.sync_dist else e.weight
                    out[key] = _to_float(agg) / _to_float(w)
                else:
                    out[key] = _to_float(agg)
        return out

    def hidden_names(self) -> set[str]:
        """Names logged with ``logger=False`` (kept out of the loggers, still returned to the caller)."""
        return {f"{e.name}_epoch" if e.on_step else e.name for e in self.values.values() if not e.logger}

    def prog_bar_names(self) -> set[str]:
        return {e.name for e in self.values.values() if e.prog_bar}

    def reset_epoch(self) -> None:
        """Start a new epoch: drop aggregates and reset logged metric objects."""
        for e in self.values.values():
            e.agg, e.weight = None, 0
            if e.metric is not None:
                e.metric.reset()
        self.values = {k: e for k, e in self.values.items() if e.on_step}

    # ---- checkpointing (exact mid-epoch resume) -------------------------------------------------------------
    _STATE_FIELDS = ("on_step", "on_epoch", "prog_bar", "logger", "reduce_fx", "sync_dist", "last", "agg", "weight",
                     "fresh")

    def state_dict(self) -> dict[str, Any]:
        """Every logged name with its options, last value and epoch aggregate (tensors and plain values), plus the
        accumulated state of logged ``torchmetrics`` objects, so a run resumed mid-epoch logs the same epoch
        values as one that never stopped."""
        out = {}
        for name, e in self.values.items():
            entry = {k: getattr(e, k) for k in self._STATE_FIELDS}
            if e.metric is not None and hasattr(e.metric, "metric_state"):
                entry["metric_state"] = {**e.metric.metric_state,
                                         "_update_count": getattr(e.metric, "_update_count", 0)}
            out[name] = entry
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; a ``torchmetrics`` state is applied to the metric object the first
        time it is logged again."""
        self.values = {}
        for name, entry in state.items():
            e = LoggedValue(name, entry["on_step"], entry["on_epoch"], entry["prog_bar"], entry["logger"],
                            entry["reduce_fx"], entry["sync_dist"])
            e.last, e.agg, e.weight, e.fresh = entry["last"], entry["agg"], entry["weight"], entry["fresh"]
            if "metric_state" in entry:
                self._pending_metric_states[name] = entry["metric_state"]
            self.values[name] = e
