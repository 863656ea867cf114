"""The ``LightningModule`` hooks a ``TaskModule`` may override beyond the ``on_*`` observers: lifecycle
(``prepare_data``, ``setup``, ``configure_model``, ``configure_callbacks``, ``teardown``), the optimization steps
(``optimizer_step``, ``optimizer_zero_grad``, ``lr_scheduler_step``, ``configure_gradient_clipping``,
``backward``) and batch transfer. The defaults do what the loops do without them; the loops call an override
exactly where Lightning calls it."""

from __future__ import annotations

from typing import Any, Callable

import torch

from taskfit.core.hook_logging import FX, running

#: The ``on_train_epoch_end`` of callbacks with ``monitors_epoch_end = True`` (EarlyStopping), a hook list of its
#: own: they run after the module's own, so they see what it logs there (Lightning calls its monitoring
#: callbacks last).
MONITORING_EPOCH_END = "on_train_epoch_end:monitoring"


class LightningHooks:
    """Mixin of :class:`taskfit.TaskModule` with Lightning's overridable hooks."""

    # the running Fit is the instance attribute _fit (no class annotation: torch.jit.script would read it)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Download or preprocess data once per machine (local rank 0), before :meth:`setup`."""

    def setup(self, stage: str) -> None:
        """Called on every process at the start of ``stage`` (``"fit"``, ``"validate"``, ``"test"``,
        ``"predict"``), after the callbacks' ``setup`` and before the loaders and optimizers are built."""

    def configure_model(self) -> None:
        """Build layers once the strategy is known (after :meth:`setup`, before the optimizers and the wrapping);
        may be called again in later stages, so make it idempotent."""

    @property
    def device_mesh(self) -> Any:
        """The run's ``torch.distributed.DeviceMesh`` (``strategy="model_parallel"``: dimensions
        ``("data_parallel", "tensor_parallel")``) for :meth:`configure_model`; None under other strategies or
        outside a run (Lightning's ``LightningModule.device_mesh``)."""
        strategy = getattr(getattr(self, "_fit", None), "strategy", None)  # None outside a run
        return None if strategy is None else strategy.device_mesh

    def configure_callbacks(self) -> Any:
        """Callbacks this module needs (a callback or a list); they join the ``Fit``'s at the start of ``fit``
        and replace callbacks of the same type, as in Lightning."""
        return []

    def teardown(self, stage: str) -> None:
        """Called on every process at the end of ``stage``, after the callbacks' ``teardown``."""

    # -- optimization -----------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (already scaled by the precision plugin); default ``loss.backward()``."""
        loss.backward(*args, **kwargs)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        """Clear the gradients at the start of an accumulation window; default ``optimizer.zero_grad()``."""
        optimizer.zero_grad()

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        """Step ``optimizer`` (a handle whose ``step`` runs the hooks, clipping and the precision plugin) at the
        end of an accumulation window; default ``optimizer.step(closure=optimizer_closure)``. Override it for a
        hand-written warm-up or to skip steps. The closure returns the window's loss (training_step and backward
        have already run, a difference from Lightning, where the closure runs them)."""
        optimizer.step(closure=optimizer_closure)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler``; default ``scheduler.step()`` (``scheduler.step(metric)`` for a metric scheduler)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip before each optimizer step; default :meth:`clip_gradients` with ``max_grad_norm`` by norm."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    # -- evaluation mode ----------------------------------------------------------------------------------
    # Called only when overridden (else the loops switch modes themselves), where Lightning calls them: zero_grad
    # before a validation inside fit, eval before the ``on_*_start`` hooks, train after the ``on_*_end`` hooks.
    def on_validation_model_zero_grad(self) -> None:
        """Drop the gradients before a validation during ``fit`` (Lightning's default frees their memory)."""
        self.zero_grad()  # type: ignore[attr-defined]  # torch 2 frees them by default; Lightning calls it bare

    def on_validation_model_eval(self) -> None:
        """Switch to evaluation mode before validation (default ``self.eval()``)."""
        self.eval()  # type: ignore[attr-defined]

    def on_validation_model_train(self) -> None:
        """Switch back to training mode after a validation (default ``self.train()``)."""
        self.train()  # type: ignore[attr-defined]

    def on_test_model_eval(self) -> None:
        """Switch to evaluation mode before testing (default ``self.eval()``)."""
        self.eval()  # type: ignore[attr-defined]

    def on_test_model_train(self) -> None:
        """Switch back to training mode after testing (default ``self.train()``)."""
        self.train()  # type: ignore[attr-defined]

    def on_predict_model_eval(self) -> None:
        """Switch to evaluation mode before predicting (default ``self.eval()``)."""
        self.eval()  # type: ignore[attr-defined]

    # -- batch transfer -----------------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch before it moves to the device (runs on the host); return it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``; default: every tensor in it (and the precision plugin's input cast)."""
        return self._fit.strategy.batch_to_device(batch)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch after it moved to the device (e.g. GPU augmentations); return it."""
        return batch


TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def overrides(module: Any, name: str) -> bool:
    """True when ``module``'s class overrides Lightning hook ``name`` of :class:`LightningHooks`, or the instance
    holds its own ``name`` (a wrapper set in ``__init__``; None there means "no such hook", as Lightning's
    ``is_overridden`` reads it)."""
    if name in getattr(module, "__dict__", ()):
        return module.__dict__[name] is not None
    return getattr(type(module), name, None) is not getattr(LightningHooks, name)


def lightning_overrides(module: Any, name: str) -> bool:
    """Lightning's ``is_overridden(name, module)``: a wrapper set on the instance counts as what it wraps
    (``functools.wraps``/``partial`` unwrapped), so a recorder around the default is not an override. Lightning
    decides with it whether to call ``configure_model`` and ``on_{validation,test}_model_train``."""
    from lightning_utilities.core.overrides import is_overridden

    if getattr(LightningHooks, name, None) is None:  # no default here: any such method is the user's own
        return getattr(module, name, None) is not None
    return is_overridden(name, module, LightningHooks)


def batch_mover(module: Any, strategy: Any) -> Callable[..., Any]:
    """``(batch, dataloader_idx=0) -> batch`` on the device: the strategy's, or the module's transfer hooks when it
    overrides any of them (before -> transfer -> after, as Lightning)."""
    if not any(overrides(module, n) for n in TRANSFER_HOOKS):
        return lambda batch, dataloader_idx=0: strategy.batch_to_device(batch)

    state = module.__dict__

    def move(batch: Any, dataloader_idx: int = 0) -> Any:
        # each hook named while it runs (self.log reads it), with plain stores: this runs per batch
        prev, state[FX] = state.get(FX), "on_before_batch_transfer"
        batch = module.on_before_batch_transfer(batch, dataloader_idx)
        state[FX] = "transfer_batch_to_device"
        batch = module.transfer_batch_to_device(batch, strategy.root_device, dataloader_idx)
        state[FX] = "on_after_batch_transfer"
        batch = module.on_after_batch_transfer(batch, dataloader_idx)
        state[FX] = prev
        return batch
    return move


def step_scheduler(module: Any, scheduler: Any, metric: float | None) -> None:
    """The module's own ``lr_scheduler_step(scheduler, metric)``, run as its running hook (``self.log`` reads it)."""
    with running(module, "lr_scheduler_step"):
        module.lr_scheduler_step(scheduler, metric)


def module_loader(module: Any, name: str) -> Any:
    """What the module's own ``name`` hook (``train_dataloader``, ``val_dataloader``, ``test_dataloader``,
    ``predict_dataloader``, as on a ``LightningModule``) returns; None when the module defines no such method."""
    fn = getattr(module, name, None)
    if not callable(fn):
        return None
    with running(module, name):
        return fn()




def module_modes(module: torch.nn.Module) -> Callable[[], None]:
    """Capture the ``training`` flag of ``module`` and of every submodule; the returned function puts them back
    (Lightning's ``_ModuleMode``: a submodule the user froze in eval mode stays there after an evaluation)."""
    modes = [(m, m.training) for m in module.modules()]

    def restore() -> None:
        for m, mode in modes:
            m.training = mode
    return restore
