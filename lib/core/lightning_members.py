"""The ``LightningModule`` members a ``TaskModule`` offers so Lightning code moves over unchanged: ``self.trainer``,
``save_hyperparameters``/``hparams``, ``print``, ``logger``/``loggers``, ``load_from_checkpoint``,
``example_input_array``, ``dtype``, and the manual-optimization helpers (``optimizers()``, ``lr_schedulers()``,
``manual_backward``, ``toggle_optimizer``, ``clip_gradients``)."""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from taskfit.core.hparams import AttributeDict, HyperparametersMixin
from taskfit.core.trainer_view import FabricTrainerView, TrainerView, is_plain_fit
from taskfit.errors import configuration_error

__all__ = ["AttributeDict", "HyperparametersMixin", "LightningMembers", "TrainerView"]


class LightningMembers(HyperparametersMixin):
    """Mixin of :class:`taskfit.TaskModule` with Lightning's ``LightningModule`` members."""

    # the running Fit is the instance attribute _fit (no class annotation: torch.jit.script would read it)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str, map_location: Any = None, hparams_file: str | None = None,
                             strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any) -> Any:
        """Build the module from the hyperparameters saved in a checkpoint and load its weights (mirrors
        Lightning's ``LightningModule.load_from_checkpoint``).

        Args:
            checkpoint_path (str | os.PathLike): a checkpoint folder (``checkpoint-<step>``, a ``ModelCheckpoint``
                folder such as ``epoch=0-step=2.ckpt``, one ``Trainer.save_checkpoint`` wrote) or a folder written
                by ``save_model``, local or a URL.
            map_location (str | torch.device | None): where to put the weights (default: CPU).
            hparams_file (str | None): a YAML (``hparams.yaml`` as the loggers write it) or JSON file whose
                hyperparameters update the saved ones.
            strict (bool | None): ``load_state_dict`` strictness (default: ``strict_loading``, True).
            weights_only (bool | None): accepted for Lightning's signature; a checkpoint folder's weights are always
                loaded safely (safetensors, or ``torch.load(weights_only=True)``).
            **kwargs: constructor arguments that override the saved hyperparameters (names ``__init__`` does not
                take are dropped unless it takes ``**kwargs``, as Lightning).

        Returns:
            the module on ``map_location``, in training mode as Lightning returns it (``.eval()`` before
            predicting).

        Raises:
            FileNotFoundError: no checkpoint at ``checkpoint_path`` ("Checkpoint file not found"), or no weights.
            RuntimeError: the weights do not fit the module and ``strict`` is not False.
        """
        from taskfit.core.loading import load_module

        return load_module(cls, checkpoint_path, map_location, hparams_file, strict, kwargs)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called with the checkpoint's contents when a run resumes or :meth:`load_from_checkpoint` loads it."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called with the training state about to be saved."""

    # -- run information --------------------------------------------------------------------------------
    @property
    def trainer(self) -> Any:
        """The running trainer: ``taskfit.lightning.Trainer`` itself, a ``Fit`` seen through Lightning's
        ``Trainer`` names (``current_epoch``, ``global_step``, ``max_epochs``, ``estimated_stepping_batches``,
        ``callback_metrics``, ``loggers``...), whatever was assigned to ``module.trainer``, or under Lightning
        Fabric a view of the ``Fabric`` (mirrors ``LightningModule.trainer``).

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        fabric = self.__dict__.get("_fabric")
        if fabric is not None:
            return FabricTrainerView(fabric)
        fit = self._fit
        if fit is None:
            if self.__dict__.get("_jit_is_scripting"):
                return None
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer` (a running Fit).")
        # a plain Fit has no Lightning names: view it; a Lightning-style trainer (ours, a user's) as it is
        return TrainerView(fit) if is_plain_fit(fit) else fit

    @trainer.setter
    def trainer(self, trainer: Any) -> None:
        """Attach ``trainer`` to this module and every ``TaskModule`` inside it (Lightning's setter)."""
        for child in self.children():
            if isinstance(child, LightningMembers):
                child.trainer = trainer
        self.__dict__["_fit"] = trainer

    @property
    def _trainer(self) -> Any:
        """The attached trainer or Fit, None when detached (Lightning's ``_trainer``)."""
        return self.__dict__.get("_fit")

    @_trainer.setter
    def _trainer(self, trainer: Any) -> None:
        self.__dict__["_fit"] = trainer  # this module only (Lightning's plain attribute)

    def _on_before_batch_transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """The module's ``on_before_batch_transfer`` (Lightning's private name, which Lightning's own
        ``ModelSummary``/``summarize`` call on ``example_input_array``)."""
        return self.on_before_batch_transfer(batch, dataloader_idx)  # type: ignore[attr-defined]

    def _apply_batch_transfer_handler(self, batch: Any, device: torch.device | None = None,
                                      dataloader_idx: int = 0) -> Any:
        """``transfer_batch_to_device`` then ``on_after_batch_transfer`` onto ``device`` (default: the module's),
        as Lightning's private method of that name; detached, the default transfer moves every tensor."""
        from lightning_utilities.core.apply_func import apply_to_collection

        from taskfit.core.hooks import LightningHooks

        device = device or self.device  # type: ignore[attr-defined]
        own = type(self).transfer_batch_to_device is not LightningHooks.transfer_batch_to_device  # type: ignore
        if own or self.__dict__.get("_fit") is not None:
            batch = self.transfer_batch_to_device(batch, device, dataloader_idx)  # type: ignore[attr-defined]
        else:  # no strategy to ask: move the tensors (Lightning's move_data_to_device)
            batch = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device))
        return self.on_after_batch_transfer(batch, dataloader_idx)  # type: ignore[attr-defined]

    @property
    def logger(self) -> Any:
        """The run's first logger (None without a run or loggers; under Fabric ``fabric.logger``)."""
        fabric = self.__dict__.get("_fabric")
        if fabric is not None:
            return fabric.logger
        return self.trainer.logger if self._fit is not None else None

    @property
    def loggers(self) -> list[Any]:
        """The run's loggers (empty without a run; under Fabric ``fabric.loggers``)."""
        fabric = self.__dict__.get("_fabric")
        if fabric is not None:
            return fabric.loggers
        return self.trainer.loggers if self._fit is not None else []

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the first floating-point parameter (``torch.get_default_dtype()`` without one)."""
        for p in self.parameters():
            if p.is_floating_point():
                return p.dtype
        return torch.get_default_dtype()

    @property
    def example_input_array(self) -> Any:
        """An example input for summaries and tracing (None unless set)."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, value: Any) -> None:
        object.__setattr__(self, "_example_input_array", value)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the process of global rank 0 only (mirrors Lightning's ``self.print``)."""
        if self._fit is None or self._fit.is_global_zero:
            print(*args, **kwargs)

    # -- manual optimization ------------------------------------------------------------------------------
    @property
    def automatic_optimization(self) -> bool:
        """False lets ``training_step`` run backward and the optimizer steps itself (Lightning's manual
        optimization); the loop then only calls ``training_step``."""
        return self.__dict__.get("_automatic_optimization", True)

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        object.__setattr__(self, "_automatic_optimization", bool(value))

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The run's optimizer, or the list of them when there are several (as Lightning's). With
        ``use_pl_optimizer`` (default) each comes in a handle whose ``step`` goes through the precision plugin
        and calls ``on_before_optimizer_step``.

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        from taskfit.core.manual import LightningOptimizer

        if self.__dict__.get("_fabric") is not None:  # Lightning Fabric: the optimizers it set up
            opts = self.__dict__.get("_fabric_optimizers", [])
            return opts[0] if len(opts) == 1 else opts
        opts = self.trainer.optimizers
        if use_pl_optimizer:
            cache = self.__dict__.setdefault("_lightning_optimizers", {})
            handles = []
            for o in opts:
                handle = cache.get(id(o))
                if handle is None or handle.optimizer is not o:
                    handle = cache[id(o)] = LightningOptimizer(o, self)
                handles.append(handle)
            opts = handles
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The run's LR scheduler, the list of them when there are several, or None (as Lightning's)."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the strategy (precision loss scaling, DDP gradient sync), for manual optimization.

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        from taskfit.core.hooks import overrides

        from taskfit.core.manual import prepare_ddp_backward

        fit = self._fit
        self._call_hook("on_before_backward", loss)
        if not self.__dict__.get("_block_backward_sync", False):
            prepare_ddp_backward(fit.strategy, loss)  # this backward all-reduces (DDP)
        if overrides(self, "backward"):
            scaler = getattr(fit.strategy.precision, "scaler", None)
            self.backward(scaler.scale(loss) if scaler is not None else loss, *args, **kwargs)
        else:
            fit.strategy.backward(loss, *args, **kwargs)
        self._call_hook("on_after_backward")

    @contextmanager
    def no_backward_sync(self, enabled: bool = True) -> Iterator[None]:
        """Inside (with ``enabled``), :meth:`manual_backward` accumulates gradients locally without the
        all-reduce (DDP) or reduce-scatter (FSDP): use it on every micro-batch of a manual accumulation window
        but the last. A no-op on one process. Mirrors ``Fabric.no_backward_sync`` (Lightning:
        ``optimizer.toggle_model(sync_grad=False)``, which uses it).

        Raises:
            RuntimeError: the module is not attached to a run.
        """
        strategy = self._fit.strategy
        previous = self.__dict__.get("_block_backward_sync", False)
        object.__setattr__(self, "_block_backward_sync", bool(enabled))
        try:
            ddp = type(strategy.model).__name__ == "DistributedDataParallel"
            # DDP: manual_backward does not arm the reducer; others (FSDP): the strategy's own switch
            with contextlib.nullcontext() if ddp else strategy.no_backward_sync(enabled):
                yield
        finally:
            object.__setattr__(self, "_block_backward_sync", previous)

    def _call_hook(self, name: str, *args: Any) -> None:
        fit = self._fit
        if fit is not None and fit._hooks.lightning.get(name):
            fit._hooks.call(name, fit, self, *args)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Make only ``optimizer``'s parameters require grad (as they did before; all others are frozen) until
        :meth:`untoggle_optimizer` (mirrors Lightning's ``toggle_optimizer``)."""
        state: dict[Any, bool] = {}
        for opt in self.trainer.optimizers:
            for g in opt.param_groups:
                for p in g["params"]:
                    if p not in state:
                        state[p] = p.requires_grad
                        p.requires_grad = False
        for g in optimizer.param_groups:
            for p in g["params"]:
                p.requires_grad = state[p]
        object.__setattr__(self, "_param_requires_grad_state", state)

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Undo :meth:`toggle_optimizer`: the other optimizers' parameters get their ``requires_grad`` back."""
        state = self._param_requires_grad_state
        inner = getattr(optimizer, "optimizer", optimizer)
        for opt in self.trainer.optimizers:
            if opt is optimizer or opt is inner:
                continue
            for g in opt.param_groups:
                for p in g["params"]:
                    if p in state:
                        p.requires_grad = state[p]
        object.__setattr__(self, "_param_requires_grad_state", {})

    @property
    def _param_requires_grad_state(self) -> dict[Any, bool]:
        """Parameter -> ``requires_grad`` saved by :meth:`toggle_optimizer` (empty when untoggled)."""
        return self.__dict__.get("_param_requires_grad_state_", {})

    @_param_requires_grad_state.setter
    def _param_requires_grad_state(self, value: dict[Any, bool]) -> None:
        self.__dict__["_param_requires_grad_state_"] = value

    @contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """:meth:`toggle_optimizer` for the duration of a ``with`` block."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Clip the gradients of ``optimizer``'s parameters by norm (default) or by value (mirrors Lightning's
        ``LightningModule.clip_gradients``). A value or algorithm not given is the trainer's
        (``Trainer(gradient_clip_val=, gradient_clip_algorithm=)``; none: no clipping, by norm).

        Raises:
            ValueError: an algorithm other than ``"norm"`` or ``"value"``; a value or algorithm that differs from
                the one the trainer was given (Lightning raises ``MisconfigurationException`` with this message).
        """
        fabric = self.__dict__.get("_fabric")
        if fabric is not None:  # Lightning Fabric clips (Lightning's LightningModule.clip_gradients)
            by_value = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value"
            fabric.clip_gradients(self, optimizer, clip_val=gradient_clip_val if by_value else None,
                                  max_norm=None if by_value else gradient_clip_val)
            return
        gradient_clip_val, algorithm = _clip_settings(self.trainer, gradient_clip_val, gradient_clip_algorithm)
        if gradient_clip_val <= 0:
            return
        if algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm={algorithm!r} is not valid; choose 'norm' or 'value'.")
        fit = self._fit
        fit.strategy.unscale_gradients(optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if algorithm == "value":
            fit.strategy.clip_gradients_value(params, gradient_clip_val, optimizer)  # DTensor shards too
        else:
            fit.strategy.clip_gradients(params, gradient_clip_val, optimizer)


def _clip_settings(trainer: Any, value: float | None, algorithm: Any) -> tuple[float, str]:
    """The clipping value and algorithm of a ``clip_gradients`` call: the arguments, else the trainer's flags
    (Lightning's rule: giving both, differently, is an error)."""
    own_value = getattr(trainer, "gradient_clip_val", None)
    own_algorithm = getattr(trainer, "gradient_clip_algorithm", None)
    own_algorithm = getattr(own_algorithm, "value", own_algorithm)  # Lightning's GradClipAlgorithmType
    if value is None:
        value = own_value or 0.0
    elif own_value is not None and own_value != value:
        raise configuration_error(f"You have set `Trainer(gradient_clip_val={own_value!r})` and have passed "
                                  f"`clip_gradients(gradient_clip_val={value!r})`. Please use only one of them.")
    if algorithm is None:
        algorithm = own_algorithm or "norm"
    else:
        algorithm = str(getattr(algorithm, "value", algorithm)).lower()
        if own_algorithm is not None and own_algorithm != algorithm:
            raise configuration_error(
                f"You have set `Trainer(gradient_clip_algorithm={own_algorithm!r})` and have passed "
                f"`clip_gradients(gradient_clip_algorithm={algorithm!r}) Please use only one of them.")
    return value, algorithm
