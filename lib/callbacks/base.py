"""Callbacks: observers of the loops with both Lightning-style and HF-style hooks (F-LOOP-6).

Order of calls during ``Fit.fit`` (callbacks in the order given, then the TaskModule's own hook of the same
name; HF-style hooks receive ``(args, state, control, **kwargs)`` and may return a ``FitControl``)::

    on_fit_start
    on_train_begin (HF)            on_train_start
    per epoch:   on_train_epoch_start, on_epoch_begin (HF)
      per micro-batch:
        on_train_batch_start(fit, module, batch, batch_idx)
        on_step_begin (HF)                                   first micro-batch of an accumulation window
        training_step -> on_before_backward(fit, module, loss) -> backward -> on_after_backward(fit, module)
        on_substep_end (HF)                                  non-final micro-batches of the window
        on_before_optimizer_step(fit, module, optimizer)     final micro-batch: before clipping
        on_pre_optimizer_step (HF)                           after clipping, before optimizer.step()
        on_optimizer_step (HF)                               after optimizer.step()
        on_before_zero_grad(fit, module, optimizer)
        on_train_batch_end(fit, module, outputs, batch, batch_idx)
        on_step_end (HF)                                     final micro-batch, global_step already advanced
        then, when triggered: on_log (HF) -> evaluation (on_validation_start ... on_validation_end,
        on_evaluate (HF)) -> checkpoint (on_save_checkpoint(fit, module, checkpoint), on_save (HF))
      on_train_epoch_end, on_epoch_end (HF), then the epoch's log / evaluation / checkpoint triggers
    on_train_end (Lightning style, then HF style)
    on_fit_end

``Fit.validate``/``test``/``predict`` call ``on_{stage}_start``, ``on_{stage}_epoch_start``,
``on_{stage}_batch_start/end`` per batch, ``on_{stage}_epoch_end``, ``on_{stage}_end``; ``validate`` also calls
``on_evaluate`` (HF) and ``predict`` calls ``on_predict`` (HF) with the metrics.

``on_train_end`` exists in both styles; the style is told apart by the hook's first parameter name
(``args`` = HF style). Only hooks a callback overrides are called (no per-step dispatch cost otherwise).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from taskfit.core.hook_logging import FX
from taskfit.core.hooks import MONITORING_EPOCH_END

if TYPE_CHECKING:
    from taskfit.protocols import FitView
    from taskfit.core.module import TaskModule

LIGHTNING_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_save_checkpoint", "on_load_checkpoint",
    "on_exception", "on_sanity_check_start", "on_sanity_check_end",
)
HF_HOOKS = (
    "on_init_end", "on_train_begin", "on_epoch_begin", "on_epoch_end", "on_step_begin", "on_substep_end",
    "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_evaluate", "on_predict", "on_save",
    "on_log", "on_prediction_step",
)


class LightningCallback:
    """The Lightning-style half of :class:`Callback`: the members of ``lightning.pytorch.Callback`` and nothing else
    (``taskfit.lightning.Callback``; a class that lists every method of it sees Lightning's hooks only). Hooks get
    ``(fit, module, ...)``, ``fit`` being the trainer.
    """

    #: run before the other callbacks in Lightning's order (the tuner's finders, as Lightning's
    #: ``_reorder_callbacks`` puts ``BatchSizeFinder``/``LearningRateFinder`` first)
    runs_first: bool = False

    @property
    def state_key(self) -> str:
        """Key of this callback's state in checkpoints (class name; override when several instances exist)."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A :attr:`state_key` from the class name and ``kwargs`` (values must have a ``repr``), e.g.
        ``"MyCallback{'what': 'x'}"``. Mirrors Lightning's ``Callback._generate_state_key``, which Lightning's docs
        show for callbacks with several instances (kept under that name so such callbacks work unchanged)."""
        return f"{type(self).__qualname__}{kwargs!r}"

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints; empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""

    # Lightning-style ------------------------------------------------------------------------------------
    def setup(self, fit: FitView, module: TaskModule, stage: str) -> None: ...
    def teardown(self, fit: FitView, module: TaskModule, stage: str) -> None: ...
    def on_fit_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_fit_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_train_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_train_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_train_epoch_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_train_epoch_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_train_batch_start(self, fit: FitView, module: TaskModule, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, fit: FitView, module: TaskModule, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_validation_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_validation_epoch_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_validation_epoch_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_validation_batch_start(self, fit: FitView, module: TaskModule, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, fit: FitView, module: TaskModule, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_test_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_test_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_test_epoch_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_test_epoch_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_test_batch_start(self, fit: FitView, module: TaskModule, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, fit: FitView, module: TaskModule, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_predict_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_predict_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_predict_epoch_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_predict_epoch_end(self, fit: FitView, module: TaskModule) -> None: ...
    def on_predict_batch_start(self, fit: FitView, module: TaskModule, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, fit: FitView, module: TaskModule, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, fit: FitView, module: TaskModule, loss: Any) -> None: ...
    def on_after_backward(self, fit: FitView, module: TaskModule) -> None: ...
    def on_before_optimizer_step(self, fit: FitView, module: TaskModule, optimizer: Any) -> None: ...
    def on_before_zero_grad(self, fit: FitView, module: TaskModule, optimizer: Any) -> None: ...
    def on_save_checkpoint(self, fit: FitView, module: TaskModule, checkpoint: dict) -> None: ...
    def on_load_checkpoint(self, fit: FitView, module: TaskModule, checkpoint: dict) -> None: ...
    def on_exception(self, fit: FitView, module: TaskModule, exception: BaseException) -> None: ...
    def on_sanity_check_start(self, fit: FitView, module: TaskModule) -> None: ...
    def on_sanity_check_end(self, fit: FitView, module: TaskModule) -> None: ...



class Callback(LightningCallback):
    """Base class for callbacks. Override any hook; the docstring of :mod:`taskfit.callbacks.base` gives the
    order. Lightning-style hooks (:class:`LightningCallback`'s) get ``(fit, module, ...)``; HF-style hooks get
    ``(args, state, control, **kwargs)`` (kwargs: ``model``, ``optimizer``, ``lr_scheduler``,
    ``train_dataloader``, ``metrics``, ``logs``) and mirror ``transformers.TrainerCallback``. Steer the run
    through ``fit.control`` flags or by returning a modified ``control`` from an HF-style hook.
    """

    # HF-style (args, state, control, **kwargs) --------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any: ...


def _is_overridden(obj: Any, name: str) -> bool:
    fn = getattr(type(obj), name, None)
    if fn is None or fn is getattr(Callback, name, None):
        return False
    # a transformers.TrainerCallback's inherited no-op hooks are not overrides either
    return not getattr(fn, "__qualname__", "").startswith("TrainerCallback.")


def _on_instance(obj: Any, name: str, hooks: tuple[str, ...]) -> bool:
    """True when Lightning hook ``name`` is set on the instance itself (a wrapper made in ``__init__``), or the
    object answers it though its class has no such member (a ``Mock(spec=Callback)``): Lightning calls it then,
    whatever the class defines; None there means no hook."""
    if name not in hooks:
        return False
    if getattr(obj, "__dict__", {}).get(name) is not None:
        return True
    return getattr(type(obj), name, None) is None and callable(getattr(obj, name, None))


def _hf_style(fn: Callable) -> bool:
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    return bool(params) and params[0].name == "args"


class HookRunner:
    """Pre-resolved hook lists: ``runner.lightning[name]`` / ``runner.hf[name]`` hold only the bound methods
    that override a hook, so the loop's ``if runner.lightning["x"]`` costs nothing when nobody listens.

    Args:
        callbacks (list): callback objects (``Callback`` subclasses or HF ``TrainerCallback`` instances).
        module (TaskModule | None): the module, whose same-named hooks run after the callbacks' (except the hooks
            a callback names in its ``hooks_after_module`` tuple: those run after the module's).
        hf_kwargs (Callable[[], dict] | None): the keyword arguments every HF-style event gets (HF's
            ``CallbackHandler.call_event``: ``model``, ``processing_class``, ``optimizer``, ...); an event's own
            keywords win.
    """

    def __init__(self, callbacks: list[Any], module: Any = None,
                 hf_kwargs: Callable[[], dict[str, Any]] | None = None) -> None:
        from taskfit.core.module import MODULE_HOOKS, TaskModule

        self.hf_kwargs = hf_kwargs

        self.lightning: dict[str, list[tuple[Callable, bool]]] = {n: [] for n in LIGHTNING_HOOKS}
        self.lightning[MONITORING_EPOCH_END] = []
        self.hf: dict[str, list[Callable]] = {n: [] for n in HF_HOOKS + ("on_train_end",)}
        late: list[tuple[str, Callable]] = []  # a callback's hooks named in its ``hooks_after_module``
        for cb in callbacks:
            for name in LIGHTNING_HOOKS + HF_HOOKS:
                if not _is_overridden(cb, name) and not _on_instance(cb, name, LIGHTNING_HOOKS):
                    continue
                fn = getattr(cb, name)
                if name in HF_HOOKS or (name == "on_train_end" and _hf_style(fn)):
                    self.hf[name].append(fn)
                elif name == "on_train_epoch_end" and getattr(cb, "monitors_epoch_end", False):
                    self.lightning[MONITORING_EPOCH_END].append((fn, True))
                elif name in getattr(cb, "hooks_after_module", ()):
                    late.append((name, fn))
                else:
                    self.lightning[name].append((fn, True))
        if isinstance(module, TaskModule):
            for name in MODULE_HOOKS:
                own = getattr(type(module), name, None)
                if name in self.lightning and (_on_instance(module, name, MODULE_HOOKS) or (
                        own is not None and own is not getattr(TaskModule, name, None))):
                    self.lightning[name].append((getattr(module, name), False))
        for name, fn in late:  # after the module's own (the Lightning door's logger start after on_fit_start)
            self.lightning[name].append((fn, True))

    def call(self, name: str, fit: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        """Call Lightning-style hook ``name``: callbacks get ``(fit, module, *args, **kwargs)``, the module
        ``(*args, **kwargs)`` (``setup``/``teardown`` take ``stage=`` by keyword, as Lightning passes it).
        Returns the module hook's return value (None without one): Lightning reads only the module's, e.g. -1
        from ``on_train_batch_start``."""
        response = None
        # the running hook, read by self.log (Lightning's _current_fx_name); only reached when someone listens
        state = getattr(module, "__dict__", {})
        prev, state[FX] = state.get(FX), name
        try:
            for fn, is_callback in self.lightning[name]:
                if is_callback:
                    fn(fit, module, *args, **kwargs)
                else:
                    response = fn(*args, **kwargs)
        finally:
            state[FX] = prev
        return response

    def call_hf(self, name: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Call HF-style hook ``name``; flags of a returned control object are copied into ``control``."""
        fns = self.hf[name]
        if fns and self.hf_kwargs is not None:
            kwargs = {**self.hf_kwargs(), **kwargs}
        for fn in fns:
            result = fn(args, state, control, **kwargs)
            if result is not None and result is not control:
                for k in vars(control):
                    setattr(control, k, bool(getattr(result, k, getattr(control, k))))
        return control
