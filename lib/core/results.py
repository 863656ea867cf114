"""Storage for values logged with ``TaskModule.log``: last value per step, running aggregate per epoch.

Values stay tensors (detached, on their device) until the loop emits them on a logging step, so logging
costs no host sync on steps where nothing is written (DESIGN.md hot-path rule).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from taskfit.errors import configuration_error

_REDUCE_FX = ("mean", "sum", "max", "min")
#: the callables Lightning's ``self.log(reduce_fx=...)`` accepts, by the name taskfit keeps
_REDUCE_CALLABLES = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max", torch.min: "min",
                     min: "min"}


def _reduce_name(reduce_fx: Any) -> Any:
    """Lightning's spellings of a reduction as taskfit's name: any case of ``"mean"``/``"avg"``/``"sum"``/``"max"``/
    ``"min"``, or ``torch.mean``, ``torch.sum``/``sum``, ``torch.max``/``max``, ``torch.min``/``min``; anything else
    is returned as given (refused by the caller)."""
    if isinstance(reduce_fx, str):
        low = reduce_fx.lower()
        return "mean" if low == "avg" else low
    try:
        return _REDUCE_CALLABLES.get(reduce_fx, reduce_fx)
    except TypeError:  # unhashable
        return reduce_fx


class LoggedValue:
    """One logged name: options plus the last value and the epoch aggregate."""

    __slots__ = ("name", "on_step", "on_epoch", "prog_bar", "logger", "reduce_fx", "sync_dist", "last",
                 "agg", "weight", "metric", "fresh", "suffix", "dataloader_idx", "hook")

    def __init__(self, name: str, on_step: bool, on_epoch: bool, prog_bar: bool, logger: bool, reduce_fx: str,
                 sync_dist: bool, suffix: str = "") -> None:
        self.name, self.on_step, self.on_epoch, self.suffix = name, on_step, on_epoch, suffix
        self.prog_bar, self.logger, self.reduce_fx, self.sync_dist = prog_bar, logger, reduce_fx, sync_dist
        self.last: Any = None
        self.agg: Any = None
        self.weight = 0
        self.metric = None  # a torchmetrics.Metric logged as an object: computed and reset per epoch
        self.fresh = False  # logged since the last emission
        self.dataloader_idx: int | None = None  # the evaluation loader it was first logged from
        self.hook: str | None = None  # the hook that first logged it, where a door checks repeated calls

    def options(self) -> tuple:
        """The options a repeated ``self.log`` of the name must give again (Lightning compares its metadata)."""
        return self.on_step, self.on_epoch, self.prog_bar, self.logger, self.reduce_fx, self.sync_dist

    def key(self, fork: str = "") -> str:
        """The emitted name: ``name{fork}{suffix}`` (Lightning's ``acc_epoch/dataloader_idx_1``)."""
        return f"{self.name}{fork}{self.suffix}"


def _to_float(v: Any) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


class ResultCollection:
    """Everything logged during one stage (``"train"``, ``"validate"``, ``"test"``, ``"predict"``).

    Args:
        batch_size_fn (Callable[[Any], int]): infers a batch's size, used to weight epoch means.
        reduce_fn (Callable | None): ``(tensor, op) -> tensor`` across processes for ``sync_dist=True``.
        sync_by_default (bool): what ``sync_dist=None`` means: True for evaluation (epoch values are full-set
            values across processes), False for training (each process's own value, as in Lightning).

    ``dataloader_idx`` (int | None) is the index of the evaluation loader running when several are given as a
    list; names logged with ``add_dataloader_idx=True`` then get Lightning's ``/dataloader_idx_N`` suffix.
    """

    def __init__(self, batch_size_fn: Callable[[Any], int], reduce_fn: Callable | None = None,
                 sync_by_default: bool = False) -> None:
        self.values: dict[str, LoggedValue] = {}
        self.batch_size_fn = batch_size_fn
        self.reduce_fn = reduce_fn
        self.sync_by_default = sync_by_default
        self.dataloader_idx: int | None = None
        self.batch: Any = None
        self._batch_size: int | None = None
        self._pending_metric_states: dict[str, dict[str, Any]] = {}  # from a checkpoint, applied on the next log
        self.dropped: list[LoggedValue] = []  # the epoch-only values the last reset_epoch() dropped

    def set_batch(self, batch: Any) -> None:
        """Record the current batch; its size is inferred only if an ``on_epoch`` mean needs it."""
        self.batch = batch
        self._batch_size = None

    def log(self, name: str, value: Any, *, on_step: bool, on_epoch: bool, prog_bar: bool, logger: bool,
            reduce_fx: str, sync_dist: bool | None, batch_size: int | None, add_dataloader_idx: bool = True,
            fx: str = "", hook: str | None = None) -> None:
        """Store ``value`` (a number, a scalar tensor or a ``torchmetrics.Metric``) under ``name``.

        ``sync_dist=None`` takes the collection's default (``sync_by_default``). ``fx``: the hook logging it when
        that hook keeps its own values (``"on_train_epoch_end"``): the same name logged in a step and in that hook
        is two values, the later one written last, as Lightning keys its results by hook and name. ``hook``: the
        running hook, given where a door refuses, as Lightning, a name logged again in that hook with other options
        (None: the first call's options are kept).

        Raises:
            ValueError: ``reduce_fx`` unknown, a tensor with more than one element, or a name logged with
                ``add_dataloader_idx=False`` from two evaluation loaders (refused by Lightning too); a
                ``ConfigurationError`` for the first (Lightning's words) and for a repeated name in ``hook`` with
                other options.
        """
        suffix = f"/dataloader_idx_{self.dataloader_idx}" if add_dataloader_idx and self.dataloader_idx is not None \
            else ""
        store = f"{fx}.{name}{suffix}" if fx else name + suffix
        entry = self.values.get(store)
        reduce_fx = _reduce_name(reduce_fx)
        if entry is None:
            if reduce_fx not in _REDUCE_FX:  # Lightning's words (its MisconfigurationException)
                raise configuration_error(
                    f"Only `self.log(..., reduce_fx={{min,max,mean,sum}})` are supported. If you need a custom "
                    f"reduction, please log a `torchmetrics.Metric` instance instead. Found: reduce_fx={reduce_fx!r} "
                    f"for {name!r}; choose one of {_REDUCE_FX}")
            sync = self.sync_by_default if sync_dist is None else bool(sync_dist)
            entry = self.values[store] = LoggedValue(name, on_step, on_epoch, prog_bar, logger, reduce_fx,
                                                             sync, suffix)
            entry.dataloader_idx, entry.hook = self.dataloader_idx, hook
        elif hook is not None and entry.hook == hook and entry.options() != (
                on_step, on_epoch, prog_bar, logger, reduce_fx,
                self.sync_by_default if sync_dist is None else bool(sync_dist)):
            raise configuration_error(f"You called `self.log({name}, ...)` twice in `{hook}` with different "
                                      "arguments. This is not allowed")
        elif entry.dataloader_idx != self.dataloader_idx:  # Lightning refuses this as well
            raise ValueError(f"self.log({name!r}, ..., add_dataloader_idx=False) was called from evaluation loaders "
                             f"{entry.dataloader_idx} and {self.dataloader_idx}; one name cannot hold values of "
                             "two loaders. Use add_dataloader_idx=True or a name per loader.")
        if hasattr(value, "compute") and hasattr(value, "update"):  # torchmetrics.Metric: compute at epoch end
            entry.metric, entry.fresh = value, True
            # the step value is the batch value of the metric's last forward() (Lightning's _forward_cache);
            # None when only update() was called, and then nothing is logged on the step
            cache = getattr(value, "_forward_cache", None)
            entry.last = cache.detach() if isinstance(cache, torch.Tensor) else cache
            if store in self._pending_metric_states:
                for k, v in self._pending_metric_states.pop(store).items():
                    setattr(value, k, v)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"self.log({name!r}, ...) needs a scalar: the tensor must have a single element, "
                                 f"got a tensor of shape {tuple(value.shape)}.")
            value = value.detach().reshape(())
        entry.last, entry.fresh = value, True
        if not on_epoch:
            return
        if reduce_fx == "mean":
            if batch_size is None:
                if self._batch_size is None:  # no batch yet (on_train_start, on_validation_start): weight 1,
                    self._batch_size = 1 if self.batch is None else self.batch_size_fn(self.batch)  # as Lightning
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

    def _device(self, value: Any) -> Any:
        """Where a collective's tensor lives: the value's device, else the strategy's (NCCL needs the GPU)."""
        if isinstance(value, torch.Tensor):
            return value.device
        return getattr(getattr(self.reduce_fn, "__self__", None), "root_device", None)

    def _sync(self, entry: LoggedValue, value: Any) -> Any:
        if entry.sync_dist and self.reduce_fn is not None:
            op = entry.reduce_fx
            value = self.reduce_fn(torch.as_tensor(value, dtype=torch.float64, device=self._device(value)), op)
        return value

    def synced_last(self, entry: LoggedValue) -> Any:
        """``entry``'s latest value, reduced over processes when it was logged with ``sync_dist`` (then a
        collective: every process must call it, in the same order)."""
        return self._sync(entry, entry.last)

    def _epoch_mean(self, entry: LoggedValue) -> float:
        """The batch-size-weighted mean; with ``sync_dist`` over every process's batches (one all-reduce of
        ``[sum, weight]`` at epoch end, so logging adds no per-step collective or host sync)."""
        agg = entry.agg
        if not (entry.sync_dist and self.reduce_fn is not None):
            return _to_float(agg) / float(entry.weight)
        device = self._device(agg)
        pair = torch.stack([torch.as_tensor(agg, dtype=torch.float64, device=device).reshape(()),
                            torch.tensor(float(entry.weight), dtype=torch.float64, device=device)])
        total = self.reduce_fn(pair, "sum")
        return _to_float(total[0]) / _to_float(total[1])

    def step_values(self, prog_bar_only: bool = False) -> dict[str, float]:
        """Floats of the ``on_step`` values logged since the last call with ``logger=True`` (or, with
        ``prog_bar_only``, those with ``prog_bar=True``); the host sync happens here."""
        out = {}
        for e in self.values.values():
            if not e.fresh or not e.on_step or e.last is None or (prog_bar_only and not e.prog_bar) or (
                    not prog_bar_only and not e.logger):
                continue
            out[e.key("_step" if e.on_epoch else "")] = _to_float(self._sync(e, e.last))
        if not prog_bar_only:
            for e in self.values.values():
                e.fresh = False
        return out

    def update_callback_metrics(self, target: dict[str, Any], synced_too: bool) -> None:
        """Write the latest ``on_step`` values into ``target`` (Lightning's training ``callback_metrics``): every
        one, ``logger=False`` included, under its name and, when also ``on_epoch``, under ``name_step`` too. The
        values stay detached 0-dim tensors (no host sync, no collective), so the loop may call this every step.

        Args:
            target (dict[str, Any]): the ``callback_metrics`` dict, updated in place.
            synced_too (bool): also write ``sync_dist`` values (their own value is the synced one only on a
                single process; on several they arrive synced with the log row and the epoch values, so that
                no two processes see different monitored values).
        """
        for e in self.values.values():
            if not e.on_step or e.last is None or (e.sync_dist and not synced_too):
                continue
            target[e.key()] = e.last
            if e.on_epoch:
                target[e.key("_step")] = e.last

    def epoch_values(self, logger_only: bool = False) -> dict[str, float]:
        """Floats of the ``on_epoch`` aggregates (``name_epoch`` when also ``on_step``)."""
        out = {}
        for e in self.values.values():
            if logger_only and not e.logger:
                continue
            key = e.key("_epoch" if e.on_step else "")
            if e.metric is not None:
                if not e.on_epoch:
                    continue
                v = e.metric.compute()
                out[key] = _to_float(v)
            elif e.on_epoch and e.agg is not None:
                if e.reduce_fx == "mean":
                    out[key] = self._epoch_mean(e)
                else:
                    out[key] = _to_float(self._sync(e, e.agg))
        return out

    def hidden_names(self) -> set[str]:
        """Names logged with ``logger=False`` (kept out of the loggers, still returned to the caller)."""
        return {e.key("_epoch" if e.on_step else "") for e in self.values.values() if not e.logger}

    def epoch_aliases(self) -> dict[str, str]:
        """``{name: name_epoch}`` for values logged with both ``on_step`` and ``on_epoch``: Lightning's
        ``callback_metrics`` also hold the epoch value under the plain name."""
        return {e.key(): e.key("_epoch") for e in self.values.values() if e.on_step and e.on_epoch}

    def prog_bar_names(self) -> set[str]:
        return {e.key() for e in self.values.values() if e.prog_bar}

    def reset_epoch(self) -> None:
        """Start a new epoch: drop aggregates and reset logged metric objects."""
        for e in self.values.values():
            e.agg, e.weight = None, 0
            if e.metric is not None:
                e.metric.reset()
        # the epoch-only names stay readable until the next reset (the Lightning door's progress-bar names)
        self.dropped = [e for e in self.values.values() if not e.on_step]
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
            entry["name"], entry["suffix"] = e.name, e.suffix  # the key may hold the hook too
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
            e = LoggedValue(entry.get("name", name), entry["on_step"], entry["on_epoch"], entry["prog_bar"],
                            entry["logger"], entry["reduce_fx"], entry["sync_dist"], entry.get("suffix", ""))
            e.last, e.agg, e.weight, e.fresh = entry["last"], entry["agg"], entry["weight"], entry["fresh"]
            if "metric_state" in entry:
                self._pending_metric_states[name] = entry["metric_state"]
            self.values[name] = e
