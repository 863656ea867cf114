"""Gradual unfreezing (mirrors Lightning's ``BaseFinetuning`` and ``BackboneFinetuning``): modules frozen before
the optimizers are built, unfrozen at an epoch start into a new optimizer param group with its own learning rate.
The optimizer's param groups are part of the callback's state, so a resumed run continues with the same groups."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any, Callable

import torch
from taskfit.callbacks.base import Callback
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

log = logging.getLogger(__name__)


def multiplicative(epoch: int) -> float:
    """Lightning's default ``lambda_func``: the backbone's learning rate doubles each epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Base of finetuning callbacks (Lightning's ``BaseFinetuning``): override :meth:`freeze_before_training`
    (called in ``setup``, before ``configure_optimizers``: build the optimizer from the parameters that require
    grad) and :meth:`finetune_function` (called at every epoch start per optimizer)."""

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)

    def on_fit_start(self, fit: Any, module: Any) -> None:
        """On resume, give each optimizer the param groups it had when the checkpoint was saved."""
        if self._restarting and self._internal_optimizer_metadata:
            named = dict(module.named_parameters())
            for i, optimizer in enumerate(fit.optimizers):
                if i in self._internal_optimizer_metadata:
                    optimizer.param_groups = _map_groups(self._internal_optimizer_metadata[i], named)
        self._restarting = False

    def setup(self, fit: Any, module: Any, stage: str) -> None:
        """Freeze before training; refuse a strategy whose engine owns the optimizer (DeepSpeed), as Lightning.

        Raises:
            NotImplementedError: under DeepSpeed (Lightning's message)."""
        self.freeze_before_training(module)
        if getattr(getattr(fit, "strategy", None), "engine_owns_step", False):
            raise NotImplementedError("The Finetuning callback does not support running with the DeepSpeed strategy. "
                                      "Choose a different strategy or disable the callback.")

    def on_train_epoch_start(self, fit: Any, module: Any) -> None:
        for i, optimizer in enumerate(fit.optimizers):
            before = len(optimizer.param_groups)
            self.finetune_function(module, fit.current_epoch, optimizer)
            names = {p: n for n, p in module.named_parameters()}
            if i not in self._internal_optimizer_metadata:
                self._internal_optimizer_metadata[i] = _map_groups(optimizer.param_groups, names)
            elif before != len(optimizer.param_groups):
                self._internal_optimizer_metadata[i].extend(_map_groups(optimizer.param_groups[before:], names))

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        """Override: unfreeze what should train from ``epoch`` on (zero-based)."""
        raise NotImplementedError

    def freeze_before_training(self, pl_module: Any) -> None:
        """Override: freeze what should not train at first."""
        raise NotImplementedError

    # -- helpers (static, as Lightning's) ----------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Module | Iterable[Any]) -> list[Module]:
        """The leaf modules of ``modules`` and the parents holding parameters directly."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            found = iter([m for sub in modules for m in BaseFinetuning.flatten_modules(sub)])
        else:
            found = modules.modules()
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Module | Iterable[Any], train_bn: bool = True, requires_grad: bool = True) -> Any:
        """The parameters of ``modules`` whose ``requires_grad`` equals ``requires_grad`` (BatchNorm's skipped
        unless ``train_bn``)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            for p in mod.parameters(recurse=False):
                if p.requires_grad == requires_grad:
                    yield p

    @staticmethod
    def make_trainable(modules: Module | Iterable[Any]) -> None:
        """``requires_grad=True`` on every parameter of ``modules``; BatchNorm tracks running stats again."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm):
                mod.track_running_stats = True
            for p in mod.parameters(recurse=False):
                p.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """``requires_grad=False`` on ``module``'s own parameters; a BatchNorm stops tracking running stats."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for p in module.parameters(recurse=False):
            p.requires_grad = False

    @staticmethod
    def freeze(modules: Module | Iterable[Any], train_bn: bool = True) -> None:
        """Freeze ``modules`` (BatchNorm layers stay trainable with ``train_bn``)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: Any, params: Iterable[Any]) -> list[Any]:
        """``params`` not already in ``optimizer`` (Lightning compares with ``torch.equal``; a warning names the
        skipped ones)."""
        out, skipped = [], []
        for p in params:
            present = any(torch.equal(q, p) for g in optimizer.param_groups for q in g["params"])
            (skipped if present else out).append(p)
        if skipped:  # Lightning's rank_zero_warn, its words
            warnings.warn("The provided params to be frozen already exist within another group of this optimizer. "
                          "Those parameters will be skipped.\nHINT: Did you init your optimizer in "
                          f"`configure_optimizer` as such:\n {type(optimizer)}(filter(lambda p: p.requires_grad, "
                          "self.parameters()), ...) ", UserWarning, stacklevel=3)
        return out

    @staticmethod
    def unfreeze_and_add_param_group(modules: Module | Iterable[Any], optimizer: Any, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group with learning rate ``lr``
        (default: the first group's learning rate / ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True))
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr / denom})


def _map_groups(groups: list[dict[str, Any]], mapping: dict[Any, Any]) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [mapping[p] for p in g["params"]]}
            for g in groups]


class BackboneFinetuning(BaseFinetuning):
    """Train the module's ``backbone`` from epoch ``unfreeze_backbone_at_epoch`` on (mirrors Lightning's
    ``BackboneFinetuning``): frozen until then; then added to the optimizer as a new param group at
    ``backbone_initial_lr`` (default: the first group's lr x ``backbone_initial_ratio_lr``), its lr multiplied by
    ``lambda_func(epoch + 1)`` at each later epoch start and, with ``should_align``, capped at the first group's.

    Args:
        unfreeze_backbone_at_epoch (int): zero-based epoch at which the backbone starts training.
        lambda_func (Callable[[int], float]): lr factor per epoch (default 2.0).
        backbone_initial_ratio_lr (float), backbone_initial_lr (float | None), should_align (bool),
        initial_denom_lr (float), train_bn (bool), verbose (bool: log the lrs), rounding (int: digits logged).

    Raises:
        ValueError: at fit start, the module has no ``backbone`` ``nn.Module`` attribute (Lightning raises its
            ``MisconfigurationException`` with the same message).
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch, self.lambda_func = unfreeze_backbone_at_epoch, lambda_func
        self.backbone_initial_ratio_lr, self.backbone_initial_lr = backbone_initial_ratio_lr, backbone_initial_lr
        self.should_align, self.initial_denom_lr, self.train_bn = should_align, initial_denom_lr, train_bn
        self.verbose, self.rounding = verbose, rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def on_fit_start(self, fit: Any, module: Any) -> None:
        if not isinstance(getattr(module, "backbone", None), Module):
            raise ValueError("The LightningModule should have a nn.Module `backbone` attribute")
        super().on_fit_start(fit, module)

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            lr = self.backbone_initial_lr if self.backbone_initial_lr is not None else \
                current_lr * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = lr
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        elif epoch > self.unfreeze_backbone_at_epoch:
            lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            lr = current_lr if self.should_align and lr > current_lr else lr
            optimizer.param_groups[-1]["lr"] = lr
            self.previous_backbone_lr = lr
        else:
            return
        if self.verbose:
            log.info("Current lr: %s, Backbone lr: %s", round(current_lr, self.rounding),
                     round(self.previous_backbone_lr, self.rounding))
