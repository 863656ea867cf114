"""``TaskModule``: what to compute. The user's one class (F-CORE-1); mirrors Lightning's ``LightningModule``."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from taskfit.core.hook_logging import FX, check_hook_log, check_metric_attribute
from taskfit.core.hooks import LightningHooks
from taskfit.core.lightning_members import LightningMembers
from taskfit.core.lightning_tools import JIT_UNUSED_PROPERTIES, LightningTools, fabric_log
from taskfit.core.model_hooks import ModelHooks
from taskfit.errors import configuration_error

if TYPE_CHECKING:
    from taskfit.protocols import FitView
    from taskfit.core.results import ResultCollection

#: Lightning-style model hooks the loops call when a TaskModule overrides them (and only then).
MODULE_HOOKS = (
    "on_fit_start", "on_fit_end", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_start",
    "on_validation_batch_end", "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_start", "on_predict_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_batch_start", "on_predict_batch_end",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
    "on_save_checkpoint", "on_load_checkpoint", "setup", "teardown",
)

IGNORE_INDEX = -100


def infer_batch_size(batch: Any) -> int:
    """Size of the first dimension of the first tensor found in ``batch`` (dict, list, tuple or tensor).

    Raises:
        ValueError: the batch holds no tensor.
    """
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    kind = type(batch)
    if kind is dict or kind is tuple or kind is list:  # the common cases, without the ABC checks (hot path: once
        first = next(iter(batch.values() if kind is dict else batch), None)  # per micro-batch) or a nested call
        if isinstance(first, torch.Tensor):
            return first.shape[0] if first.dim() else 1
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        items = ()
    for v in items:
        try:
            return infer_batch_size(v)
        except ValueError:
            continue
    if isinstance(batch, (list, tuple)) and batch:
        return len(batch)  # e.g. a list of strings a training_step tokenises itself
    if isinstance(batch, Mapping):
        sized = [v for v in batch.values() if isinstance(v, (list, tuple))]
        if sized:
            return len(sized[0])
    raise ValueError(f"Cannot infer the batch size of a {type(batch).__name__}: it holds no tensor.")


def _check_loggable(name: str, value: Any) -> None:
    """Refuse what ``self.log`` cannot hold (anything but a number, a tensor or a ``torchmetrics.Metric``), in
    Lightning's words, before it reaches the run.

    Raises:
        ValueError: a nested dict, or a value of another type (None, str, list, dict...).
    """
    if isinstance(value, Mapping) and any(isinstance(v, Mapping) for v in value.values()):
        raise ValueError(f"`self.log({name}, {value})` was called, but nested dictionaries cannot be logged")
    if not (isinstance(value, (numbers.Number, torch.Tensor)) or hasattr(value, "compute") and hasattr(value, "update")):
        raise ValueError(f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be "
                         "logged")


class TaskModule(LightningMembers, LightningTools, LightningHooks, ModelHooks, nn.Module):
    """A ``torch.nn.Module`` that says how to train, evaluate and predict (F-CORE-1).

    Override :meth:`training_step` (required) and any of :meth:`validation_step`, :meth:`test_step`,
    :meth:`predict_step`, :meth:`configure_optimizers`, :meth:`num_items` and the ``on_*`` hooks listed in
    :data:`MODULE_HOOKS`. Talk back to the run only through :meth:`log`/:meth:`log_dict` and :attr:`fit`.

    Step methods receive the batch already on the module's device and the index of the batch in the epoch.
    """

    #: ``self.log`` on a module no run holds: False raises RuntimeError; True warns and does nothing (Lightning's
    #: ``LightningModule``, so step methods can be tested without a trainer)
    _log_without_fit_warns = False

    def __init__(self) -> None:
        super().__init__()
        self._fit: FitView | None = None
        self._results: ResultCollection | None = None
        self._log_defaults: tuple[bool, bool] = (True, False)  # (on_step, on_epoch) for the running stage

    # -- what to compute --------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any]:
        """Return the loss of one micro-batch: a scalar tensor or a dict with key ``"loss"``.

        For exact gradient accumulation the loss must be a *mean* over the items :meth:`num_items` counts
        (samples, or non-ignored tokens); the loop re-weights micro-batches by their item counts.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx).")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Evaluate one batch. Log metrics with ``self.log``; optionally return a loss tensor or a dict with
        ``"loss"``, ``"logits"`` (or ``"predictions"``) and ``"labels"`` for ``compute_metrics``."""

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Like :meth:`validation_step`, for ``Fit.test``; defaults to :meth:`validation_step`."""
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """Return predictions for one batch (``dataloader_idx``: the loader's index among several, as Lightning's
        ``predict_step`` takes it). Default: ``self(**inputs)`` for dict batches (label keys removed),
        ``self(batch[0])`` for ``(inputs, labels)`` tuples, ``self(batch)`` otherwise."""
        if isinstance(batch, Mapping):
            return self(**{k: v for k, v in batch.items() if k not in ("labels", "label", "label_ids")})
        if isinstance(batch, (list, tuple)):
            return self(batch[0])
        return self(batch)

    def configure_optimizers(self) -> Any:
        """Return an optimizer, ``(optimizer, scheduler)``, ``{"optimizer": ..., "lr_scheduler": ...}`` or None.

        None (the default) builds the optimizer and LR schedule named by ``FitArguments`` (``optim``,
        ``learning_rate``, ``weight_decay``, ``lr_scheduler_type``, ``warmup_steps``...), as the HF Trainer does.
        A scheduler returned here is stepped once per optimizer step.
        """
        return None

    def num_items(self, batch: Any) -> int | torch.Tensor | None:
        """Number of items the training loss averages over in ``batch`` (used for exact accumulation).

        Default: for a dict batch with ``"labels"`` of 2+ dimensions (token labels), the count of labels that
        are not ``-100`` (a 0-dim tensor, so counting forces no host sync); otherwise the batch size. Return
        an int or a 0-dim integer tensor, or None to weight micro-batches equally.
        """
        if isinstance(batch, Mapping):
            labels = batch.get("labels")
            if isinstance(labels, torch.Tensor) and labels.dim() >= 2:
                return (labels != IGNORE_INDEX).sum()  # a 0-dim tensor: no host sync
        return infer_batch_size(batch)

    # -- logging ----------------------------------------------------------------------------------------
    def log(self, name: str, value: Any, prog_bar: bool = False, logger: bool | None = None,
            on_step: bool | None = None,
            on_epoch: bool | None = None, reduce_fx: str = "mean", sync_dist: bool | None = None,
            batch_size: int | None = None, add_dataloader_idx: bool = True, metric_attribute: str | None = None
            ) -> None:
        """Log a scalar (number, 0-dim/1-element tensor or ``torchmetrics.Metric``) under ``name``.

        Mirrors ``LightningModule.log``. Defaults mirror Lightning: in ``training_step`` ``on_step=True,
        on_epoch=False``; in validation/test steps ``on_step=False, on_epoch=True`` (a batch-size-weighted mean
        over the epoch). Tensors are kept on their device and converted to floats only on steps where something
        is written. A ``torchmetrics.Metric`` gives the batch value of its last ``forward()`` on the step and
        ``compute()`` on the epoch.

        ``sync_dist``: whether an epoch value is reduced over processes (for ``"mean"`` weighted by batch size,
        so it equals the value over the whole data set). None (the default) means True for values logged during
        evaluation and False during training; Lightning's default is False everywhere. The reduction runs once
        at the end of the epoch. ``add_dataloader_idx``: with several evaluation loaders given as a list, append
        ``/dataloader_idx_N`` to the name (Lightning's rule); with False, every loader adds to one value. Under
        ``taskfit.lightning.Trainer(barebones=True)`` nothing is logged and a warning says so (Lightning).

        ``logger``: None (the default) means True; an explicit True while the run has no logger warns, as
        Lightning. ``metric_attribute`` (str | None): the module attribute holding a logged ``torchmetrics.Metric``
        (Lightning's argument); under ``taskfit.lightning`` a Metric the module does not hold is refused without it.

        Under ``taskfit.lightning`` the calls Lightning refuses raise its ``MisconfigurationException``: in a hook
        that cannot log, outside any hook the trainer runs, once no trainer method runs, during ``predict``.

        Raises:
            RuntimeError: called outside a running ``Fit`` stage.
            ValueError: a non-scalar tensor, an unknown ``reduce_fx``, ``/dataloader_idx_`` in ``name`` with
                ``add_dataloader_idx=True``, or ``on_step`` and ``on_epoch`` both False (nothing would be kept).
        """
        if self.__dict__.get("_fabric") is not None:  # run by Lightning Fabric: its loggers, at once
            return fabric_log(self.__dict__["_fabric"], {name: value}, logger is not False)
        if getattr(self.__dict__.get("_fit"), "barebones", False):  # Lightning's Trainer(barebones=True)
            warnings.warn("You are trying to `self.log()` but `Trainer(barebones=True)` is configured. Logging can "
                          "impact raw speed so it is disabled under this setting.", stacklevel=2)
            return
        _check_loggable(name, value)
        fit = self._fit
        if fit is None and self._log_without_fit_warns:  # Lightning: step methods may be tested without a trainer
            warnings.warn("You are trying to `self.log()` but the `self.trainer` reference is not registered on the "
                          "model yet. This is most likely because the model hasn't been passed to the `Trainer`",
                          UserWarning, stacklevel=2)
            return
        results = self._results
        rules = getattr(getattr(fit, "loop_policy", None), "log_hooks", None)
        if rules is not None:  # the door's table of the hooks that may log (Lightning's _FxValidator)
            check_hook_log(rules, self.__dict__.get(FX), on_step, on_epoch, fit.collects_logs)
        if results is None:
            raise RuntimeError(f"self.log({name!r}) was called outside a Fit stage; call it from a *_step or hook.")
        if add_dataloader_idx and "/dataloader_idx_" in name:
            raise configuration_error(
                f"You called `self.log` with the key `{name}` but it should not contain information about "
                "`dataloader_idx` when `add_dataloader_idx=True`: the suffix is appended for you (or "
                "pass add_dataloader_idx=False).")  # Lightning's words
        if getattr(getattr(fit, "loop_policy", None), "metric_attribute_required", False):
            check_metric_attribute(self, name, value, metric_attribute)
        if logger and self._fit is not None and not getattr(self._fit, "loggers", True):
            warnings.warn(f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. You can "
                          "enable one by doing `Trainer(logger=ALogger(...))`. Remove `logger=True` to remove this "
                          "warning.", UserWarning, stacklevel=2)  # Lightning's warning, for an explicit True only
        logger = True if logger is None else logger
        d_step, d_epoch = self._log_defaults
        on_step, on_epoch = d_step if on_step is None else on_step, d_epoch if on_epoch is None else on_epoch
        if not on_step and not on_epoch:  # Lightning's message (it raises MisconfigurationException)
            raise configuration_error("`self.log(on_step=False, on_epoch=False)` is not useful.")
        results.log(name, value, on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, logger=logger,
                    reduce_fx=reduce_fx, sync_dist=sync_dist, batch_size=batch_size,
                    add_dataloader_idx=add_dataloader_idx, fx=self.__dict__.get("_log_fx", ""),
                    hook=None if rules is None else self.__dict__.get(FX))  # the door refuses changed options

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """Call :meth:`log` for every item of ``dictionary`` with the same options.

        Raises:
            As :meth:`log`; under Lightning Fabric ``ValueError`` for a nested dict or a non-scalar value.
        """
        if self.__dict__.get("_fabric") is not None:
            return fabric_log(self.__dict__["_fabric"], dict(dictionary), kwargs.get("logger", True))
        if hasattr(dictionary, "_enable_compute_groups"):  # a torchmetrics MetricCollection, read as Lightning
            # does: no base-name prefix, and metrics sharing a compute group keep one state (no copies)
            items = dictionary.items(keep_base=False, copy_state=not dictionary._enable_compute_groups)
        else:
            items = dictionary.items()
        for k, v in items:
            self.log(k, v, **kwargs)

    # -- run information --------------------------------------------------------------------------------
    @property
    def fit(self) -> FitView:
        """The ``Fit`` running this module.

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        if self._fit is None and not self.__dict__.get("_jit_is_scripting"):  # torch.jit reads every attribute
            raise RuntimeError(f"{type(self).__name__} is not attached to a Fit run.")
        return self._fit

    @property
    def device(self) -> torch.device:
        """Device of the first parameter (CPU for a module without parameters)."""
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far: the trainer's ``global_step`` (0 when detached)."""
        return self.trainer.global_step if self._fit is not None else 0

    @property
    def current_epoch(self) -> int:
        """Zero-based index of the running epoch; the Lightning door's trainer counts the finished epochs after
        training, as Lightning (0 when detached)."""
        return self.trainer.current_epoch if self._fit is not None else 0

    def num_parameters(self, only_trainable: bool = False) -> int:
        """Count of parameter elements (F-CORE-7), mirrors HF ``PreTrainedModel.num_parameters``."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not only_trainable)


# torch.jit.script compiles every property of a module not listed here: none of ours is TorchScript
TaskModule.__jit_unused_properties__ = sorted(
    set(JIT_UNUSED_PROPERTIES) | {n for c in TaskModule.__mro__ for n, v in vars(c).items() if isinstance(v, property)})


def overridden_hooks(obj: Any, base: type, names: tuple[str, ...]) -> list[str]:
    """Names in ``names`` whose implementation on ``type(obj)`` differs from ``base``'s."""
    cls = type(obj)
    return [n for n in names if getattr(cls, n, None) is not getattr(base, n, None)]
