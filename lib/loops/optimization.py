"""One optimizer step of the fit loop: one window of micro-batches (F-LOOP-1, F-LOOP-2).

What the window's step does, in order: the weight of each micro-batch's loss (:func:`window_weights`), the
training closure per micro-batch (``training_step``, ``zero_grad`` on the first micro-batch, backward), then once
per window the unscale / ``on_before_optimizer_step`` / clipping and the optimizer step. :class:`AutomaticStep`
does it for automatic optimization (mirrors Lightning's ``_AutomaticOptimization``), :class:`ManualStep` for
manual optimization (``training_step`` steps the optimizers itself; Lightning's ``_ManualOptimization``).

The optimizer specialities (LOMO's fused backward, layer-wise GaLore/APOLLO, schedule-free train/eval mode, an
HF ``training_step`` override) are one :class:`StepPolicy` chosen once per run by :func:`choose_policy`: the step
calls the policy's ``backward``/``optimizer_step`` and never branches on the optimizer kind.

The step objects are built once per run and reused for every window: no closure, dict or handle is made per
micro-batch.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch

from taskfit.core.hook_logging import call_named, call_plain, named_step
from taskfit.core.step_call import by_signature, positional_capacity
from taskfit.core.hooks import overrides
from taskfit.core.manual import LightningOptimizer, manual_outer_forward
from taskfit.optim.hf_optimizers import fused_backward_of, optimizers_with_modes
from taskfit.optim.layerwise import check_layer_wise_run


def extract_training_loss(out: Any) -> torch.Tensor:
    """The scalar loss of a ``training_step`` result (a tensor or a dict with ``"loss"``).

    Raises:
        TypeError: neither a tensor nor a dict with a tensor ``"loss"``.
        ValueError: not a scalar, or it does not require grad.
    """
    loss = out if isinstance(out, torch.Tensor) else out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"training_step must return a scalar loss tensor or a dict with key 'loss'; it returned "
                        f"{type(out).__name__}{' without a loss' if isinstance(out, Mapping) else ''}.")
    if loss.numel() != 1:
        raise ValueError(f"training_step must return a scalar loss; got a tensor of shape {tuple(loss.shape)}. "
                         "Reduce it (e.g. .mean()) first.")
    if not loss.requires_grad:
        raise ValueError("training_step returned a loss that does not require grad (computed under no_grad, "
                         "detached, or the module has no trainable parameters).")
    return loss


def manual_loss(out: Any) -> torch.Tensor | None:
    """The loss a manual-optimization ``training_step`` returned (a scalar tensor, or a dict with one under
    ``"loss"``), detached as a 0-dim tensor, only for the logged running loss; None when it returned none (then
    the step adds nothing to the logged loss: Lightning logs only what it is given)."""
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    return None


def batch_outputs(out: Any, loss: torch.Tensor | None) -> dict[str, Any]:
    """What ``on_train_batch_end`` receives as ``outputs`` (Lightning): ``{"loss": <detached, accumulation-scaled
    loss>}`` plus the other items of a dict ``training_step`` result; without ``"loss"`` when ``loss`` is None (a
    manual-optimization step that returned none: Lightning's ``ManualResult`` is then ``{}``). ``loss`` is
    detached here (only a run with this hook pays for it)."""
    extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, Mapping) else {}
    return {"loss": loss.detach(), **extra} if loss is not None else extra


def precision_scaled(precision: Any, loss: torch.Tensor) -> torch.Tensor:
    """``loss`` times the precision plugin's loss scale (what a module's own ``backward`` receives)."""
    scaler = getattr(precision, "scaler", None)
    return scaler.scale(loss) if scaler is not None else loss


def window_weights(counts: list[Any], world: int = 1, even_counts: bool = False,
                   reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
                   device: torch.device | None = None) -> list[Any]:
    """The weight of each micro-batch's loss in one accumulation window, so that the window's loss equals the
    loss of the same items as one batch (DESIGN.md "Loop semantics"; HF's ``num_items_in_batch`` rule).

    Args:
        counts (list[int | Tensor | None]): the item count of each micro-batch of the window on this process
            (``TaskModule.num_items``: samples, or e.g. non-ignored tokens; a 0-dim tensor stays a tensor, so no
            host sync); a None anywhere means "not countable": every micro-batch weighs ``1 / len(counts)``.
        world (int): processes whose gradients are averaged (DDP divides by it).
        even_counts (bool): the counts are equal on every process (plain batch sizes of a loader that splits
            evenly): no all-reduce, ``c / sum(counts)``.
        reduce (Callable[[Tensor, str], Tensor] | None): the strategy's ``reduce`` (``"sum"`` over processes);
            needed when ``world > 1`` and not ``even_counts``.
        device (torch.device | None): where the all-reduced total lives.

    Returns:
        list: one weight per micro-batch (floats, or 0-dim tensors when counts are tensors or all-reduced):
        ``c / total`` on one process, ``c * world / total_over_processes`` on several (the total at least 1).
    """
    if any(c is None for c in counts):
        return [1.0 / len(counts)] * len(counts)
    if even_counts and all(isinstance(c, int) for c in counts):
        return [c / sum(counts) for c in counts]  # = c * W / (W * sum): same on every rank
    if world > 1:  # the window's items on every rank; DDP then averages over the W ranks
        total = reduce(torch.as_tensor(sum(counts), dtype=torch.float32, device=device), "sum").clamp(min=1)
        return [c * world / total for c in counts]
    total = sum(counts)
    total = total.clamp(min=1) if isinstance(total, torch.Tensor) else max(total, 1)
    return [c / total for c in counts]


def training_function(strategy: Any, module: Any, named: bool = False) -> Callable[[Any, int], Any]:
    """``module.training_step`` through the strategy's route (e.g. the DDP wrapper's ``forward``), called as
    ``fx(batch, batch_idx)``; trimmed to ``fx(batch)`` for a ``training_step(batch)`` (valid Lightning), and the
    route itself otherwise (no wrapper call per step). ``named``: run as the module's running hook
    ``"training_step"`` (a door whose ``self.log`` checks the running hook: ``LoopPolicy.log_hooks``)."""
    step_fn = strategy.step_function(module, "training_step")
    n = positional_capacity(module.training_step)
    step_fn = step_fn if n is None or n >= 2 else by_signature(step_fn, module.training_step)
    return named_step(module, "training_step", step_fn) if named else step_fn


def _no_step(optimizer: Any, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
    """The optimizer step of an optimizer that updated the parameters during backward (LOMO): nothing left but
    the closure, if any (it runs the backward that updates)."""
    if closure is not None:
        closure()
    return True


def step_needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` requires a closure (``torch.optim.LBFGS``: ``step(closure)`` re-evaluates the
    loss), read from its signature."""
    try:
        param = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def _plain_optimizer_step(optimizer: Any, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
    """``optimizer.step()`` (``optimizer.step(closure=closure, **kwargs)`` when given either, as
    ``Precision.optimizer_step``): a strategy's ``optimizer_step`` when it is the plain one (its
    ``plain_step_parts`` names ``"optimizer_step"``), without the strategy and precision layers per step."""
    if closure is None and not kwargs:
        optimizer.step()
    else:
        optimizer.step(closure=closure, **kwargs)
    return True


@dataclass(frozen=True)
class StepPolicy:
    """How the optimizer of a run steps, chosen once before the loop (:func:`choose_policy`).

    Attributes:
        name (str): ``"default"`` or ``"fused_backward"`` (LOMO / AdaLomo update inside backward, as accelerate's
            ``lomo_backward``; their ``step`` is a no-op). Layer-wise GaLore / APOLLO step each parameter in its
            backward hook and present a no-op optimizer: they run under ``"default"`` once checked.
        backward (Callable[[Tensor], None]): the backward of a weighted micro-batch loss.
        optimizer_step (Callable[[Optimizer], bool]): the first optimizer's step; False when skipped (overflow).
        mode_optimizers (tuple): schedule-free optimizers, switched to ``train()`` before every training step
            (an evaluation switched them to ``eval()``, as HF); empty for any other optimizer.
        hf_step (HFTrainingStep | None): a ``Fit`` subclass's HF ``training_step`` override, which runs forward
            and backward itself; None otherwise.
        zero_grad_after_step (bool): free the gradients (``zero_grad(set_to_none=True)``) once the step has been
            logged, before the next window's forward, as HF's ``Trainer`` (``model.zero_grad()`` after the optimizer
            and scheduler steps), so the old gradients are not alive during the next forward; False keeps
            Lightning's closure order (``training_step``, ``zero_grad``, backward). See :func:`zero_grad_after_step`.
    """

    name: str
    backward: Callable[[torch.Tensor], Any]
    optimizer_step: Callable[[Any], bool]
    mode_optimizers: tuple = ()
    hf_step: Any = None
    zero_grad_after_step: bool = False


def zero_grad_after_step(module: Any, args: Any, strategy: Any, hooks: Any, default_step: bool) -> bool:
    """Whether a run may free its gradients right after each step (HF's order) instead of in the next closure
    (Lightning's order); the optimizer trajectory is the same either way.

    False, keeping Lightning's order, when the difference can be observed: the module overrides
    ``optimizer_zero_grad`` or a callback or the module overrides ``on_before_zero_grad`` (Lightning hooks whose
    timing users see); the step is not the default one (LOMO's fused backward, an engine that owns the step such as
    DeepSpeed, which zeroes itself); or the gradient norm is computed only when a log row or a save needs it (no
    clipping) and an epoch-end row or save may read the last step's gradients (``logging_strategy`` or
    ``save_strategy`` ``"epoch"``, or an HF ``on_epoch_end`` callback that may raise those flags).

    Args:
        module (TaskModule): the module being trained. args (FitArguments): the run's options.
        strategy (Strategy): ``engine_owns_step``. hooks (HookRunner): the resolved hooks.
        default_step (bool): the policy steps with the strategy's ``backward``/``optimizer_step``.
    """
    if not default_step or strategy.engine_owns_step or overrides(module, "optimizer_zero_grad"):
        return False
    if hooks.lightning["on_before_zero_grad"]:
        return False
    lazy_norm = not (args.max_grad_norm and args.max_grad_norm > 0) and not overrides(
        module, "configure_gradient_clipping")
    epoch_reads = "epoch" in (args.logging_strategy, args.save_strategy) or bool(hooks.hf["on_epoch_end"])
    return not (lazy_norm and epoch_reads)


def choose_policy(run: Any, strategy: Any, manual: bool, accumulation_scheduled: bool, args: Any = None,
                  hooks: Any = None, hf_step: Any = None) -> StepPolicy:
    """The :class:`StepPolicy` of ``run``.

    Args:
        run (Run): its ``optimizers`` (the first decides the policy) and ``module``.
        strategy (Strategy): ``backward``/``optimizer_step``; an engine that owns the step keeps them.
        manual (bool): manual optimization (no fused backward: the module runs backward itself).
        accumulation_scheduled (bool): a callback changes the accumulation per epoch (layer-wise refuses it).
        args (FitArguments | None), hooks (HookRunner | None): for :func:`zero_grad_after_step`; without them
            the policy keeps Lightning's zero_grad order.
        hf_step (Callable | None): an HF ``Trainer.training_step`` override of the run, as the owner resolved it
            before the loop (``(batch, batch_idx) -> detached loss``), or None (the module's ``training_step``).

    Raises:
        ValueError / NotImplementedError: a LOMO or layer-wise optimizer in a run it cannot do (several
            processes, a wrapping strategy, a gradient scaler, an accumulation schedule), as HF refuses.
    """
    optimizers = run.optimizers
    fused = None if manual or strategy.engine_owns_step else fused_backward_of(optimizers[0], strategy)
    check_layer_wise_run(optimizers[0], strategy, accumulation_scheduled)
    modes = tuple(optimizers_with_modes(optimizers))
    if fused is not None:
        return StepPolicy("fused_backward", fused, _no_step, modes, hf_step)
    early = (not manual and args is not None and hooks is not None
             and zero_grad_after_step(run.module, args, strategy, hooks, default_step=True))
    plain = strategy.plain_step_parts()  # the strategy's plain layers are skipped per step
    backward = torch.Tensor.backward if "backward" in plain else strategy.backward
    optimizer_step = _plain_optimizer_step if "optimizer_step" in plain else strategy.optimizer_step
    return StepPolicy("default", backward, optimizer_step, modes, hf_step, early)


class ManualStep:
    """The step of manual optimization: ``training_step`` runs backward and steps the optimizers itself
    (Lightning's ``_ManualOptimization``); windows hold one micro-batch.

    Args:
        loop (FitLoop): the loop (its run, strategy).
    """

    def __init__(self, loop: Any) -> None:
        self.strategy = strategy = loop.strategy
        self.train_fx = training_function(strategy, loop.run.module, loop.loop_policy.log_hooks is not None)
        self.fwd_ctx, self.device = strategy.forward_context, strategy.root_device

    def start_window(self, window: list[Any], weights: list[Any] | None, epoch: int) -> None:
        """Nothing to prepare: manual optimization has no window weights."""

    def micro_batch(self, i: int, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """``(training_step output, its detached loss or None)`` of one batch."""
        with self.fwd_ctx(), manual_outer_forward(self.strategy):
            out = self.train_fx(batch, batch_idx)
        return out, manual_loss(out)

    def finish_window(self) -> bool:
        """False: the loop's schedulers of interval ``"step"`` are the module's to step."""
        return False

    def free_gradients(self) -> None:
        """Nothing: the module zeroes its own gradients."""

    def freed_optimizers(self) -> tuple:
        """None: the module zeroes its own gradients."""
        return ()


class AutomaticStep:
    """The step of automatic optimization over one window (Lightning's ``_AutomaticOptimization``): per
    micro-batch the closure (``training_step`` with the loss times its window weight, ``zero_grad`` on the first,
    backward with the gradient sync on the last only), then unscale, ``on_before_optimizer_step``, clipping and
    the step of every optimizer. A module's own ``optimizer_step`` runs the last micro-batch's closure itself.

    Args:
        loop (FitLoop): the loop (run, owner, args, strategy, hooks, sums; ``_norm_due`` is set on it when the
            step's gradient norm is only computed if a log row or a save needs it).
        policy (StepPolicy): the run's optimizer speciality.
    """

    def __init__(self, loop: Any, policy: StepPolicy) -> None:
        run, args, strategy = loop.run, loop.args, loop.strategy
        self.loop, self.policy, self.strategy, self.hooks, self.owner = loop, policy, strategy, loop.hooks, loop.owner
        self.args, self.state, self.control, self.sums = args, run.state, run.control, loop.sums
        self.module = module = run.module
        self.optimizers = run.optimizers
        self.optimizer, self.other_optimizers = run.optimizers[0], run.optimizers[1:]
        self.train_fx = training_function(strategy, module, loop.loop_policy.log_hooks is not None)
        self.fwd_ctx, self.precision = strategy.forward_context, strategy.precision
        self.L, self.H = loop.hooks.lightning, loop.hooks.hf
        engine = strategy.engine_owns_step
        self.own_zero_grad = overrides(module, "optimizer_zero_grad")
        # the module's own hooks below run as its running hook where the door checks self.log (Lightning)
        self.own_hook = call_named if loop.loop_policy.log_hooks is not None else call_plain
        self.own_backward = overrides(module, "backward") and not engine
        self.own_clipping = overrides(module, "configure_gradient_clipping") and not engine
        self.max_norm, self.clip_by_value = args.max_grad_norm, args.gradient_clip_algorithm == "value"
        # what configure_gradient_clipping receives as its algorithm: the flag as given (Lightning's policy: None
        # when not given), else the algorithm in effect
        self.clip_algorithm_arg = loop.loop_policy.clip_algorithm_argument(self.max_norm, self.clip_by_value)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.hf_step = policy.hf_step
        # the last micro-batch's closure runs inside optimizer.step(closure=...) (Lightning; an LBFGS needs it
        # under Fit too), and then the closure zeroes the gradients: the optimizer may call it several times
        self.closure_in_step = loop.loop_policy.closure_in_optimizer_step or step_needs_closure(self.optimizer)
        self.zero_in_closure = not policy.zero_grad_after_step or self.closure_in_step  # else freed after steps
        self.none_skips, self.world = loop.loop_policy.none_loss_skips_batch, strategy.world_size
        self.forward_backward = self._hf_forward_backward if policy.hf_step is not None else self._forward_backward
        # the strategy's layers that do nothing here (one CPU process, fp32) are skipped per micro-batch
        plain = strategy.plain_step_parts()
        self.plain_forward, self.plain_unscale = "forward" in plain, "unscale" in plain
        self._closure_body = self.forward_backward if "sync" in plain else self._run_closure
        self.plain_optimizer_step = policy.optimizer_step is _plain_optimizer_step
        # no on_before_optimizer_step hook, no clipping, no engine norm: before_step would only mark the gradient
        # norm as due (computed in the loop only for a log row or a save)
        self.norm_only = not (self.L["on_before_optimizer_step"] or self.own_clipping or engine
                              or (self.max_norm and self.max_norm > 0))
        own_step = overrides(module, "optimizer_step") and not engine
        self._last_micro_batch = (self._own_optimizer_step if own_step else
                                  self._closure_step if self.closure_in_step else self._closure_body)
        self.finish_window = self._own_step_result if own_step or self.closure_in_step else self._step_optimizers
        # Lightning keeps one LightningOptimizer per optimizer for the run; `stepped` is reset per window
        self.handles = [LightningOptimizer(opt, module, self.after_closure) for opt in self.optimizers]
        self._before_step = self.before_step  # bound once: no method object per window
        self._step_closure_fn = self._step_closure
        self.weights: list[Any] | None = None
        self.items: Any = None
        self.last, self.epoch, self.stepped = 0, 0, False
        self._i, self._batch, self._batch_idx = 0, None, 0
        self._out: Any = None
        self._loss: Any = None
        self._ran = False  # the closure ran in this window's last micro-batch
        self._warned_none = False

    def start_window(self, window: list[Any], weights: list[Any] | None, epoch: int) -> None:
        """Prepare the window's micro-batches (``window``: the batches as loaded; ``weights``: from
        :func:`window_weights`, None for 1)."""
        self.last, self.weights, self.epoch = len(window) - 1, weights, epoch
        self.items = self.hf_step.items(window) if self.hf_step is not None else None  # HF num_items_in_batch

    def micro_batch(self, i: int, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor]:
        """Run micro-batch ``i`` of the window (on the device); returns ``(training_step output, weighted
        loss)``. The last one also steps the optimizers when the module overrides ``optimizer_step``."""
        self._i, self._batch, self._batch_idx, self._loss = i, batch, batch_idx, None
        if i == self.last:
            self._last_micro_batch()
        else:
            self._closure_body()
        return self._out, self._loss

    def closure(self) -> torch.Tensor | None:
        """Lightning's training closure (what a module's ``optimizer_step`` receives): training_step, zero_grad
        (first micro-batch of a window), backward; returns the detached weighted loss (None: the batch was
        skipped, see :attr:`LoopPolicy.none_loss_skips_batch`)."""
        self._run_closure()
        return self._loss.detach() if self._loss is not None else None

    def _run_closure(self) -> None:
        """The closure without its return value (the loop reads ``_loss`` itself: no detach per micro-batch)."""
        self._ran = True
        with self.strategy.no_backward_sync(enabled=self._i != self.last):
            self.forward_backward()

    def _hf_forward_backward(self) -> None:
        """An HF ``training_step`` override: zero_grad first, the override runs backward itself."""
        i = self._i
        if i == 0 and self.zero_in_closure:
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
        with self.fwd_ctx():
            self._out = self._loss = self.hf_step(self._batch, self.weights[i] if self.weights is not None else None,
                                                  self.items)

    def _forward_backward(self) -> None:
        i, module, hooks, L = self._i, self.module, self.hooks, self.L
        if self.plain_forward:  # the context would be a no-op
            out = self.train_fx(self._batch, self._batch_idx)
        else:
            with self.fwd_ctx():
                out = self.train_fx(self._batch, self._batch_idx)
        if out is None and self.none_skips:  # Lightning: no backward; zero_grad and the step still run
            loss = self._skipped()
        else:
            # the usual result, checked inline (a call less per micro-batch); anything else is checked in full
            loss = out if type(out) is torch.Tensor and out.requires_grad and out.numel() == 1 else \
                extract_training_loss(out)
            if self.weights is not None:
                loss = loss * self.weights[i]
        if i == 0 and self.zero_in_closure:
            for opt in self.optimizers:
                L["on_before_zero_grad"] and hooks.call("on_before_zero_grad", self.owner, module, opt)
                if self.own_zero_grad:
                    self.own_hook(module, "optimizer_zero_grad", self.epoch, self._batch_idx, opt)
                else:
                    opt.zero_grad(set_to_none=True)
        self._out, self._loss = out, loss
        if loss is None:
            return
        L["on_before_backward"] and hooks.call("on_before_backward", self.owner, module, loss)
        if self.own_backward:
            self.own_hook(module, "backward", precision_scaled(self.precision, loss))
        else:
            self.policy.backward(loss)
        L["on_after_backward"] and hooks.call("on_after_backward", self.owner, module)

    def _skipped(self) -> None:
        """``training_step`` returned None (:attr:`LoopPolicy.none_loss_skips_batch`): no loss, no backward.

        Raises:
            RuntimeError: several processes (Lightning's message: the ranks would disagree on the backward)."""
        if self.world > 1:
            raise RuntimeError("Skipping the `training_step` by returning None in distributed training is not "
                               "supported. It is recommended that you rewrite your training logic to avoid having "
                               "to skip the step in the first place.")
        if not self._warned_none:  # once per run, as Lightning's warning cache
            self._warned_none = True
            warnings.warn("`training_step` returned `None`. If this was on purpose, ignore this warning...",
                          UserWarning, stacklevel=2)

    def _step_closure(self) -> torch.Tensor | None:
        """The closure ``optimizer.step`` receives (Lightning's ``Closure`` inside ``_wrap_closure``): the last
        micro-batch's training_step, zero_grad, backward, then unscale, ``on_before_optimizer_step`` and
        clipping; returns the detached loss (None for a skipped batch)."""
        with torch.enable_grad():
            self._run_closure()
        self.strategy.before_optimizer_step(self.optimizer, self._before_step)
        return self._loss.detach() if self._loss is not None else None

    def _closure_step(self) -> None:
        """The last micro-batch as Lightning runs it: ``optimizer.step(closure=...)`` runs the closure (an LBFGS
        several times), then the other optimizers step as in :meth:`_step_optimizers`."""
        self.H["on_pre_optimizer_step"] and self.hooks.call_hf("on_pre_optimizer_step", self.args, self.state,
                                                               self.control)
        self._ran = False
        self.stepped = self.policy.optimizer_step(self.optimizer, self._step_closure_fn)
        if not self._ran:  # the optimizer never called the closure (Lightning runs nothing either): no output
            self._out, self._loss = None, None
        for opt in self.other_optimizers:
            self.strategy.before_optimizer_step(opt, self._before_step)
            self.strategy.optimizer_step(opt)

    def free_gradients(self) -> None:
        """``zero_grad(set_to_none=True)`` of every optimizer when the policy frees gradients after the step
        (:attr:`StepPolicy.zero_grad_after_step`: at the run's start and after each step's log row); nothing when
        the closure zeroes them (Lightning's order)."""
        for opt in self.freed_optimizers():
            opt.zero_grad(set_to_none=True)

    def freed_optimizers(self) -> tuple:
        """The optimizers :meth:`free_gradients` zeroes (none when the closure zeroes them)."""
        return () if self.zero_in_closure else tuple(self.optimizers)

    def _detached_loss(self) -> torch.Tensor:
        """The closure of the second and later optimizers: the loss the first one's closure computed."""
        return self._loss.detach()

    def _own_optimizer_step(self) -> None:
        """The module's ``optimizer_step`` runs the closure (Lightning), once per optimizer."""
        self.H["on_pre_optimizer_step"] and self.hooks.call_hf("on_pre_optimizer_step", self.args, self.state,
                                                               self.control)
        self._ran = False
        for j, handle in enumerate(self.handles):
            handle.__dict__["stepped"] = False
            self.own_hook(self.module, "optimizer_step", self.epoch, self._batch_idx, handle,
                          self.closure if j == 0 else self._detached_loss)
        if not self._ran:
            raise RuntimeError("optimizer_step did not call optimizer_closure: call "
                               "optimizer.step(closure=optimizer_closure) or the closure itself.")
        self.stepped = any(h.stepped for h in self.handles)

    def _own_step_result(self) -> bool:
        return self.stepped

    def _step_optimizers(self) -> bool:
        """Unscale, hooks and clipping per optimizer, then every optimizer's step; False when the first one's
        step was skipped (overflow)."""
        strategy, before_step = self.strategy, self._before_step
        if self.plain_unscale and self.norm_only:  # nothing to unscale, clip or call: what before_step would do
            self.loop._norm_due = True
        elif self.plain_unscale:  # nothing to unscale: the strategy would only call the hook
            for opt in self.optimizers:
                before_step(opt)
        else:
            for opt in self.optimizers:  # after_closure, inlined: one call less per step
                strategy.before_optimizer_step(opt, before_step)
        self.H["on_pre_optimizer_step"] and self.hooks.call_hf("on_pre_optimizer_step", self.args, self.state,
                                                               self.control)
        if self.plain_optimizer_step:
            self.optimizer.step()
            stepped = True
        else:
            stepped = self.policy.optimizer_step(self.optimizer)
        for opt in self.other_optimizers:
            self.strategy.optimizer_step(opt)
        return stepped

    def after_closure(self, opt: Any) -> None:
        """Between backward and the optimizer step (Lightning): the strategy unscales (its step path is the one
        place that does), then :meth:`before_step` sees the unscaled gradients."""
        self.strategy.before_optimizer_step(opt, self._before_step)

    def before_step(self, opt: Any) -> None:
        """``on_before_optimizer_step``, then clipping (the module's ``configure_gradient_clipping`` or
        ``max_grad_norm``), on unscaled gradients."""
        module, max_norm, optimizer, strategy = self.module, self.max_norm, self.optimizer, self.strategy
        self.L["on_before_optimizer_step"] and self.hooks.call("on_before_optimizer_step", self.owner, module, opt)
        if self.own_clipping:
            clip = max_norm if max_norm and max_norm > 0 else None
            self.own_hook(module, "configure_gradient_clipping", opt, gradient_clip_val=clip,  # by keyword (Lightning)
                          gradient_clip_algorithm=self.clip_algorithm_arg)
        elif max_norm and max_norm > 0 and opt is optimizer:
            if self.clip_by_value:  # elementwise, so exact on shards
                strategy.clip_gradients_value(self.params, max_norm, optimizer)
            else:
                self.sums.grad_norm = strategy.clip_gradients(self.params, max_norm, optimizer)
        elif opt is optimizer and strategy.engine_owns_step:  # HF 5 logs the norm without clipping too: the
            self.sums.grad_norm = strategy.clip_gradients(self.params, math.inf, optimizer)  # engine's norm
        elif opt is optimizer:  # HF 5 logs the norm without clipping too: computed in the loop's _after_step,
            self.loop._norm_due = True  # only for a log row or a save
