"""Layer-wise optimizers (F-LOOP-4): HF's ``optim="galore_adamw_layerwise"``, ``"galore_adamw_8bit_layerwise"``,
``"galore_adafactor_layerwise"`` and ``"apollo_adamw_layerwise"``.

Each parameter gets its own optimizer and its own LR schedule, stepped inside backward by a
``register_post_accumulate_grad_hook`` as soon as that parameter's gradient is complete (then its gradient is
freed), so the gradients of the whole model never exist at once. Mirrors transformers 5's
``_setup_low_rank_optimizer`` (layer-wise branch), ``LayerWiseDummyOptimizer``, ``LayerWiseDummyScheduler`` and the
layer-wise branch of ``get_scheduler``. (transformers 5.23 itself never takes that branch: its
``create_scheduler`` receives accelerate's wrapper of the placeholder optimizer, so there every parameter trains at
the constant ``learning_rate`` while the log shows the schedule; with ``lr_scheduler_type="constant"`` both agree
exactly.)

The training loop sees one :class:`LayerWiseOptimizer` and one :class:`LayerWiseScheduler`: the optimizer's
``step`` and ``zero_grad`` do nothing (the hooks did the work); the scheduler's ``step`` copies the learning rate of
the first parameter's schedule into the optimizer's one group, which is the rate the loop logs (HF logs the same
value). Gradients are gone after backward, so clipping finds none and the logged ``grad_norm`` is 0.0, as under
transformers. What HF refuses is refused here too: gradient accumulation, several processes (and, unlike HF,
which trains on with scaled gradients, a gradient scaler).

Checkpoints: ``state_dict()`` of both objects holds HF's keys plus ``"layerwise"``, the list of per-parameter
states (optimizer objects such as GaLore's projectors written as plain attributes, so the file loads with
``torch.load(weights_only=True)``); resuming restores every parameter's optimizer and schedule exactly.
transformers saves only its placeholder optimizer, so a layer-wise checkpoint it wrote is refused
(``CheckpointError``) instead of silently restarting every parameter's optimizer and schedule.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from taskfit.optim.construct import is_single_process

__all__ = ["LayerWiseOptimizer", "LayerWiseScheduler", "build_layer_wise", "check_layer_wise_run", "with_plain_state"]

#: packages whose objects in an optimizer's state (GaLore / APOLLO projectors) are saved as plain attributes
_OBJECT_PACKAGES = ("galore_torch", "apollo_torch")
_OBJECT_KEY = "__taskfit_object__"

#: id(parameter) -> (weak reference to it, handles of the layer-wise hooks on it): a new layer-wise optimizer over
#: the same parameter (a second ``fit`` of the same model) removes the previous one's hooks, so a parameter is
#: never stepped twice per backward.
_HOOKS: dict[int, tuple[Any, list[Any]]] = {}


def _release(params: list[torch.Tensor]) -> None:
    for p in params:
        entry = _HOOKS.pop(id(p), None)
        if entry is not None and entry[0]() is p:
            for handle in entry[1]:
                handle.remove()
    for key in [k for k, (ref, _) in _HOOKS.items() if ref() is None]:
        del _HOOKS[key]


def _register(param: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> Any:
    entry = _HOOKS.get(id(param))
    if entry is None or entry[0]() is not param:
        entry = _HOOKS[id(param)] = (weakref.ref(param), [])
    handle = param.register_post_accumulate_grad_hook(hook)
    entry[1].append(handle)
    return handle


def _step_and_free(optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:  # HF's optimizer_hook
        if param.grad is not None:
            optimizer.step()
            optimizer.zero_grad()
    return hook


def _step_schedule(scheduler: Any) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:  # HF's scheduler_hook
        scheduler.step()
    return hook


def _checkpoint_error(message: str) -> Exception:
    from taskfit.io.checkpoint_io import CheckpointError

    return CheckpointError(message)


def _plain(value: Any) -> Any:
    """``value`` with GaLore / APOLLO objects replaced by ``{_OBJECT_KEY: "module:Class", "attributes": ...}``."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    cls = type(value)
    if cls.__module__.split(".")[0] in _OBJECT_PACKAGES and hasattr(value, "__dict__"):
        return {_OBJECT_KEY: f"{cls.__module__}:{cls.__qualname__}", "attributes": _plain(vars(value))}
    return value


def _restored(value: Any, device: torch.device, in_object: bool = False) -> Any:
    """The inverse of :func:`_plain`; tensors inside restored objects go to ``device`` (the optimizer's own
    ``load_state_dict`` places its state tensors, not those inside objects)."""
    if isinstance(value, dict):
        if _OBJECT_KEY in value:
            module, _, qualname = str(value[_OBJECT_KEY]).partition(":")
            if module.split(".")[0] not in _OBJECT_PACKAGES:
                raise _checkpoint_error(f"optimizer.pt names the class {value[_OBJECT_KEY]!r}, which is not one of "
                                        f"the packages {_OBJECT_PACKAGES} a layer-wise optimizer state may hold.")
            cls: Any = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part, None)
            if not isinstance(cls, type) or cls.__module__ != module:  # only a class defined in that module
                raise _checkpoint_error(f"optimizer.pt names {value[_OBJECT_KEY]!r}, which is not a class of {module}.")
            obj = cls.__new__(cls)
            obj.__dict__.update(_restored(value["attributes"], device, in_object=True))
            return obj
        return {k: _restored(v, device, in_object) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_restored(v, device, in_object) for v in value)
    if in_object and isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def with_plain_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` (a GaLore / APOLLO optimizer stepping all its parameters) with state-dict hooks that write its
    projector objects as plain attributes and restore them on load, as the layer-wise form does: its
    ``optimizer.pt`` then loads with ``torch.load(weights_only=True)`` and a run resumes without trusting pickles.
    Returns ``optimizer``."""
    device = next((p.device for g in optimizer.param_groups for p in g["params"]), torch.device("cpu"))
    optimizer.register_state_dict_post_hook(lambda _opt, state: _plain(state))
    optimizer.register_load_state_dict_pre_hook(lambda _opt, state: _restored(state, device))
    return optimizer


class LayerWiseOptimizer(torch.optim.Optimizer):
    """One optimizer per parameter, each stepped (then its gradient freed) by a post-accumulate-grad hook during
    backward; this object is what the training loop holds. Mirrors transformers' ``LayerWiseDummyOptimizer``
    together with the hooks ``_setup_low_rank_optimizer`` registers.

    Args:
        optimizers (dict[Parameter, Optimizer]): each parameter's optimizer (HF's ``optimizer_dict``, in its
            order: the parameters outside ``optim_target_modules``, then the target weights). Hooks go on the
            parameters with ``requires_grad``.
        lr (float): the learning rate of the one placeholder group (``learning_rate``); the scheduler keeps it at
            the first parameter's current rate.
        name (str): the ``optim`` name (for messages).

    Attributes:
        optimizer_dict (dict[Parameter, Optimizer]): HF's name for ``optimizers``.
    """

    def __init__(self, optimizers: dict[torch.Tensor, torch.optim.Optimizer], lr: float, name: str) -> None:
        # HF's dummy optimizer holds one random placeholder tensor: drawing it the same way keeps the global RNG
        # stream (data order, dropout) in step with transformers.Trainer
        super().__init__([torch.randn(1, 1)], {"lr": lr})
        self.optimizer_dict = optimizers
        self.name = name
        params = list(optimizers)
        _release(params)
        self._schedule_hooks: list[Any] = []
        for param, optimizer in optimizers.items():
            if param.requires_grad:
                _register(param, _step_and_free(optimizer))

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Nothing to update (the hooks did); a ``closure`` (a Lightning-style ``optimizer_step`` passes one) still
        runs, since its backward is what updates the parameters."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: each hook frees its parameter's gradient after the step."""

    def attach_schedules(self, schedulers: list[Any]) -> None:
        """Step ``schedulers[i]`` after the ``i``-th parameter's optimizer, in the same hook order (HF
        ``get_scheduler``'s ``scheduler_hook``); replaces schedules attached before."""
        for handle in self._schedule_hooks:
            handle.remove()
        self._schedule_hooks = [_register(param, _step_schedule(scheduler))
                                for param, scheduler in zip(self.optimizer_dict, schedulers) if param.requires_grad]

    def state_dict(self) -> dict[str, Any]:
        """The placeholder's state (what transformers saves) plus ``"layerwise"``: every parameter's optimizer
        state, in ``optimizer_dict`` order."""
        state = super().state_dict()
        state["layerwise"] = [_plain(opt.state_dict()) for opt in self.optimizer_dict.values()]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            CheckpointError: no per-parameter states (a layer-wise checkpoint transformers wrote: resuming it would
                restart every parameter's optimizer), or a different number of parameters.
        """
        state = dict(state_dict)
        per_param = state.pop("layerwise", None)
        if per_param is None:
            raise _checkpoint_error(
                f"optim={self.name!r}: the checkpoint's optimizer.pt holds no per-parameter optimizer states (a "
                "layer-wise checkpoint written by transformers.Trainer, which saves only its placeholder optimizer). "
                "Resuming would restart every parameter's optimizer and learning-rate schedule; start a new run "
                "from the checkpoint's weights instead.")
        if len(per_param) != len(self.optimizer_dict):
            raise _checkpoint_error(f"optim={self.name!r}: the checkpoint holds {len(per_param)} per-parameter "
                                    f"optimizer states, the model has {len(self.optimizer_dict)} parameters.")
        super().load_state_dict(state)
        for (param, optimizer), saved in zip(self.optimizer_dict.items(), per_param):
            optimizer.load_state_dict(_restored(saved, param.device))


class LayerWiseScheduler(LRScheduler):
    """One LR schedule per parameter, each stepped right after its parameter's optimizer inside backward; this
    object is what the training loop steps once per optimizer step. Mirrors transformers'
    ``LayerWiseDummyScheduler`` with the layer-wise branch of ``get_scheduler``.

    Args:
        optimizer (LayerWiseOptimizer): the layer-wise optimizer.
        schedule (Callable[[Optimizer], LRScheduler]): builds one parameter's schedule (the schedule
            ``lr_scheduler_type`` names, over the run's steps).

    Its ``step`` sets the optimizer's one group to the first parameter's current rate (HF's
    ``get_last_lr()[0]``), which the loop reads before stepping as the rate the step used.
    """

    def __init__(self, optimizer: LayerWiseOptimizer, schedule: Callable[[torch.optim.Optimizer], Any]) -> None:
        self.schedulers = [schedule(opt) for opt in optimizer.optimizer_dict.values()]
        optimizer.attach_schedules(self.schedulers)
        self.default_lr = optimizer.defaults["lr"]
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """The first parameter's current rate, for the one placeholder group."""
        first = next(iter(self.optimizer.optimizer_dict.values()))
        return [first.param_groups[0]["lr"]]

    def state_dict(self) -> dict[str, Any]:
        """An ``LRScheduler``'s keys plus ``"layerwise"``: every parameter's schedule state (and ``lr_lambdas``,
        so that the ``LambdaLR`` transformers 5.23 builds for a layer-wise run loads the file)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "schedulers")}
        state["lr_lambdas"] = [None]
        state["layerwise"] = [s.state_dict() for s in self.schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            CheckpointError: no per-parameter schedules (written by transformers), or a different number.
        """
        state = dict(state_dict)
        per_param = state.pop("layerwise", None)
        if per_param is None or len(per_param) != len(self.schedulers):
            raise _checkpoint_error(
                f"the checkpoint's scheduler.pt holds {'no' if per_param is None else len(per_param)} per-parameter "
                f"schedules; this layer-wise run has {len(self.schedulers)}: resuming would restart them.")
        state.pop("lr_lambdas", None)
        self.__dict__.update(state)
        for scheduler, saved in zip(self.schedulers, per_param):
            scheduler.load_state_dict(saved)


def build_layer_wise(name: str, cls: type, param_groups: list[dict[str, Any]], kwargs: dict[str, Any],
                     args: Any) -> LayerWiseOptimizer:
    """``cls([{**group, "params": [p]}], **kwargs)`` for every parameter ``p`` of every group, in order, wrapped
    in a :class:`LayerWiseOptimizer` (HF's layer-wise branch of ``_setup_low_rank_optimizer``).

    Raises:
        ValueError: ``gradient_accumulation_steps`` is not 1 (as HF: each parameter is updated as soon as its
            gradient of one micro-batch is complete).
    """
    accumulation = getattr(args, "gradient_accumulation_steps", 1)
    if accumulation != 1:
        raise ValueError(f"Layerwise {name} does not support gradient accumulation (gradient_accumulation_steps="
                         f"{accumulation}; it must be 1): each parameter is updated inside backward as soon as its "
                         "gradient is complete.")
    optimizers = {p: cls([{**group, "params": [p]}], **kwargs) for group in param_groups for p in group["params"]}
    return LayerWiseOptimizer(optimizers, lr=kwargs["lr"], name=name)


def check_layer_wise_run(optimizer: Any, strategy: Any, accumulation_scheduled: bool) -> None:
    """Refuse a run a layer-wise optimizer cannot do (the fit loop calls it once per run, before training); any
    other optimizer passes.

    Args:
        optimizer (Any): the run's first optimizer.
        strategy (Strategy): the run's strategy.
        accumulation_scheduled (bool): a callback changes ``gradient_accumulation_steps`` per epoch.

    Raises:
        NotImplementedError: several processes or a wrapping strategy (HF: "does not support DDP").
        ValueError: an accumulation schedule, or a gradient scaler (``16-mixed``: the hooks would step with scaled
            gradients).
    """
    if not isinstance(optimizer, LayerWiseOptimizer):
        return
    if not is_single_process(strategy):
        raise NotImplementedError(
            f"Layer-wise {optimizer.name} does not support distributed training: its hooks update each parameter "
            f"inside backward, before any gradient sync. It runs on one process (strategy 'single_device'); got "
            f"{type(strategy).__name__} with {strategy.world_size} process(es).")
    if accumulation_scheduled:
        raise ValueError(f"Layerwise {optimizer.name} does not support gradient accumulation: remove the callback "
                         "that schedules gradient_accumulation_steps.")
    if getattr(strategy.precision, "scaler", None) is not None:
        raise ValueError(f"optim={optimizer.name!r} does not work with a gradient scaler (precision '16-mixed'): its "
                         "hooks would step with scaled gradients. Use 'bf16-mixed' or '32-true'.")
