"""The fit loop: epochs, accumulation windows, clipping, optimizer/scheduler steps and the log / evaluate /
save triggers (F-LOOP-1..3, F-LOOP-6). One optimizer step = one window of ``gradient_accumulation_steps``
micro-batches (the last window of an epoch may be shorter)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch

from taskfit.data.loaders import set_loader_epoch, skip_first_batches, splits_evenly
from taskfit.loops.finite import check_finite
from taskfit.core.module import TaskModule, infer_batch_size
from taskfit.core.hooks import batch_mover, overrides
from taskfit.optim.hf_optimizers import fused_backward_of, optimizers_with_modes
from taskfit.optim.layerwise import check_layer_wise_run
from taskfit.core.manual import LightningOptimizer, manual_outer_forward
from taskfit.seed import set_rng_states

if TYPE_CHECKING:
    from taskfit.fit.run import Run


def _extract_training_loss(out: Any) -> torch.Tensor:
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


def _manual_loss(out: Any, device: torch.device) -> torch.Tensor:
    """The loss a manual-optimization ``training_step`` returned (a tensor, a dict with ``"loss"``, or None:
    then 0), only for the logged running loss."""
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    return torch.zeros((), device=device)


def batch_outputs(out: Any, loss: torch.Tensor) -> dict[str, Any]:
    """What ``on_train_batch_end`` receives as ``outputs`` (Lightning): ``{"loss": <detached, accumulation-scaled
    loss>}`` plus the other items of a dict ``training_step`` result."""
    extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, Mapping) else {}
    return {"loss": loss, **extra}


def precision_scaled(precision: Any, loss: torch.Tensor) -> torch.Tensor:
    """``loss`` times the precision plugin's loss scale (what a module's own ``backward`` receives)."""
    scaler = getattr(precision, "scaler", None)
    return scaler.scale(loss) if scaler is not None else loss


def resolve_interval(value: float | None, max_steps: int) -> int:
    """HF rule for ``logging_steps``/``eval_steps``/``save_steps``: a value < 1 is a ratio of ``max_steps``."""
    if value is None:
        return max_steps
    return max(1, math.ceil(value * max_steps)) if value < 1 else int(value)


def accumulation_schedule(callbacks: Any) -> Callable[[int], int] | None:
    """The accumulation per epoch (0-based) a callback sets (Lightning's ``GradientAccumulationScheduler``:
    its ``get_accumulate_grad_batches(epoch)``); None when no callback schedules it."""
    for cb in callbacks or ():
        per_epoch = getattr(cb, "get_accumulate_grad_batches", None)
        if callable(per_epoch):
            return per_epoch
    return None


def plan_steps(loader: Any, args: Any, accumulation: Callable[[int], int] | None = None
               ) -> tuple[int | None, int, int]:
    """``(steps_per_epoch, max_steps, num_epochs)`` for a training loader (HF ``max_steps`` rules: ``max_steps``
    > 0 wins, else ``ceil(num_train_epochs * steps_per_epoch)``; the last window of an epoch may be short).
    With an ``accumulation`` schedule (epoch -> micro-batches per step) that changes between epochs, the plan
    counts each epoch's windows: ``steps_per_epoch`` is the first epoch's, ``max_steps`` the sum over the
    ``ceil(num_train_epochs)`` epochs (a fractional last epoch is not cut: Lightning counts whole epochs).

    Raises:
        ValueError: a loader without batches, or without a length while ``max_steps`` is not set.
    """
    try:
        n_batches = len(loader)
    except TypeError:
        n_batches = None
    if n_batches == 0:
        raise ValueError("The train DataLoader yields no batches (dataset smaller than one batch with "
                         "dataloader_drop_last=True?).")
    accum_at = accumulation or (lambda epoch: args.gradient_accumulation_steps)
    steps_per_epoch = math.ceil(n_batches / accum_at(0)) if n_batches else None
    epochs = math.ceil(args.num_train_epochs)
    per_epoch = [math.ceil(n_batches / accum_at(e)) for e in range(epochs)] if n_batches and accumulation else []
    if args.max_steps and args.max_steps > 0:
        max_steps = args.max_steps
    elif steps_per_epoch is None:
        raise ValueError("The train data has no length (IterableDataset); set max_steps > 0.")
    elif len(set(per_epoch)) > 1:
        max_steps = sum(per_epoch)
    else:
        max_steps = max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
    if len(set(per_epoch)) > 1:  # the epoch in which the max_steps-th step falls
        total, num_epochs = 0, 0
        while total < max_steps:
            total += math.ceil(n_batches / accum_at(num_epochs))
            num_epochs += 1
    else:
        num_epochs = math.ceil(max_steps / steps_per_epoch) if steps_per_epoch else sys.maxsize
    return steps_per_epoch, max_steps, num_epochs


def _window(iterator: Any, size: int) -> list[Any]:
    out = []
    for _ in range(size):
        try:
            out.append(next(iterator))
        except StopIteration:
            break
    return out


class FitLoop:
    """Drives training for one ``Fit.fit`` call: the run owns the objects, this class owns the order.

    Args:
        run (Run): the run, already set up (module on device, optimizers and schedulers from ``Strategy.setup``,
            loaders, state; restored when resuming).
        owner (Fit): what callbacks receive as ``fit``.
        args (FitArguments): the run's options.
        strategy (Strategy): placement and communication.
        hooks (HookRunner): the resolved callback hooks.
        log (Callable[[dict], None]): sends a log row to loggers and ``on_log``.
        evaluate (Callable[[], dict]): evaluation during training (metrics).
        save (Callable[[dict], str]): writes a checkpoint of the given training state; returns its path.
    """

    def __init__(self, run: Run, owner: Any, args: Any, strategy: Any, hooks: Any, log: Callable[[dict], None],
                 evaluate: Callable[[], dict], save: Callable[[dict], str]) -> None:
        self.run, self.owner, self.args, self.strategy, self.hooks = run, owner, args, strategy, hooks
        self._log, self._evaluate, self._save = log, evaluate, save
        self.sums = run.sums
        self._norm_due: Any = None  # (params, optimizer) of a step whose gradient norm is not computed yet
        self.stop: Any = None  # taskfit.fit.signals.GracefulStop: read once per optimizer step

    def run_epochs(self, loader: Any, steps_per_epoch: int | None, num_epochs: int) -> None:
        """Train until ``state.max_steps`` or ``num_epochs`` or a stop flag; a restored run continues where its
        checkpoint was taken (also when that was after the last step: only the end of the run is left)."""
        run, fit, args, hooks, strategy = self.run, self.owner, self.args, self.hooks, self.strategy
        state, control, module, sums = run.state, run.control, run.module, self.sums
        train_fx = strategy.step_function(module, "training_step")  # through the wrapper's forward
        optimizers = run.optimizers
        optimizer, other_optimizers = optimizers[0], optimizers[1:]
        L, H = hooks.lightning, hooks.hf
        scheduled_accumulation = accumulation_schedule(getattr(fit, "callbacks", ()))
        accum_at = scheduled_accumulation or (
            lambda epoch, accum=args.gradient_accumulation_steps: accum)
        max_norm = args.max_grad_norm
        clip_by_value = args.gradient_clip_algorithm == "value"
        params = [p for p in module.parameters() if p.requires_grad]
        record_loss = sums.nan_filter.add if args.logging_nan_inf_filter else None  # filtered where the sum is read
        sums.tr_loss = sums.tr_loss.to(strategy.root_device)
        sums.nan_filter.reset(sums.tr_loss, sums.steps_since_log)
        world = strategy.world_size
        readers = getattr(strategy, "data_parallel_size", world)  # tensor-parallel ranks share their samples
        fwd_ctx = strategy.forward_context
        precision = strategy.precision
        manual = not module.automatic_optimization
        move = batch_mover(module, strategy)
        engine = strategy.engine_owns_step
        own_zero_grad = overrides(module, "optimizer_zero_grad")
        own_backward = overrides(module, "backward") and not engine
        own_clipping = overrides(module, "configure_gradient_clipping") and not engine
        own_step = overrides(module, "optimizer_step") and not engine
        flos_per_sample = run.flos_per_sample
        # LOMO / AdaLomo update inside backward (HF: accelerate's lomo_backward); their step is a no-op. Decided
        # once per run: other optimizers keep the strategy's backward and step.
        fused = None if manual or engine else fused_backward_of(optimizer, strategy)
        backward = strategy.backward if fused is None else fused
        optimizer_step = strategy.optimizer_step if fused is None else (lambda opt: True)
        # layer-wise GaLore / APOLLO step each parameter in its backward hook; the loop sees a no-op optimizer and
        # schedule and runs as usual (clipping finds no gradient, as in HF). Refused here where HF refuses.
        check_layer_wise_run(optimizer, strategy, scheduled_accumulation is not None)
        mode_optimizers = optimizers_with_modes(optimizers)  # schedule-free: train() before each training step
        hf_step = getattr(fit, "_hf_training_step", lambda _run: None)(run)  # a Fit subclass's training_step (HF): forward and backward in it

        def after_closure(opt: Any) -> None:
            """Between backward and the optimizer step (Lightning): unscale, hooks, then clipping."""
            precision.unscale_gradients(opt)
            L["on_before_optimizer_step"] and hooks.call("on_before_optimizer_step", fit, module, opt)
            if own_clipping:
                clip = max_norm if max_norm and max_norm > 0 else None
                module.configure_gradient_clipping(opt, clip, ("value" if clip_by_value else "norm") if clip else None)
            elif max_norm and max_norm > 0 and opt is optimizer:
                if clip_by_value:  # gradients already unscaled above; elementwise, so exact on shards
                    strategy.clip_gradients_value(params, max_norm, optimizer)
                else:
                    sums.grad_norm = strategy.clip_gradients(params, max_norm, optimizer)
            elif opt is optimizer and strategy.engine_owns_step:  # HF 5 logs the norm without clipping too: the
                sums.grad_norm = strategy.clip_gradients(params, math.inf, optimizer)  # engine's norm of the step
            elif opt is optimizer:  # HF 5 logs the norm without clipping too:
                self._norm_due = (params, optimizer)  # computed in _after_step, only for a log row or a save

        # batch-size item counts are equal on every process when the loader splits evenly or is not split (tensor
        # parallel ranks read the same batches): no per-step all-reduce (a custom num_items, e.g. a token count,
        # may differ per process and is all-reduced)
        even_counts = (world > 1 and (readers == 1 or splits_evenly(loader))
                       and getattr(type(module), "num_items", None) is TaskModule.num_items)
        try:
            batches_per_epoch = len(loader)
        except TypeError:
            batches_per_epoch = None
        resumed = run.resume_from is not None
        rng = run.training_state.rng if resumed and run.training_state is not None else None
        finished = resumed and state.global_step >= state.max_steps  # saved at the last step: only the end is left
        for epoch in range(state.current_epoch, num_epochs):
            skip = state.batch_in_epoch if resumed else 0
            if resumed and not skip and rng is not None:
                set_rng_states(rng, strategy.accelerator)  # saved at an epoch boundary: before this epoch
            state.current_epoch = epoch
            set_loader_epoch(loader, epoch)
            control._new_epoch()
            if not skip:  # resumed mid-epoch: keep the restored epoch aggregates
                module._results.reset_epoch()
            hooks.call("on_train_epoch_start", fit, module)
            H["on_epoch_begin"] and hooks.call_hf("on_epoch_begin", args, state, control, **run.hf_kwargs())
            # read per epoch: a callback may change them at the epoch's start (Lightning's
            # GradientAccumulationScheduler, StochasticWeightAveraging's SWALR)
            accum = accum_at(epoch)
            counts_needed = not manual and (accum > 1 or world > 1)
            step_schedulers = [c for c in run.schedulers if c.interval == "step"]
            epoch_schedulers = [c for c in run.schedulers if c.interval == "epoch" and not c.reduce_on_plateau]
            plateau_epoch = [c for c in run.schedulers if c.interval == "epoch" and c.reduce_on_plateau]
            if finished:
                control.should_training_stop = True
                iterator = iter(())
            else:
                iterator = iter(skip_first_batches(loader, skip))
            state.batch_in_epoch = skip
            if skip and rng is not None:
                set_rng_states(rng, strategy.accelerator)  # saved mid-epoch: after the epoch's iterator existed
            resumed, rng = False, None
            while not finished:
                window = _window(iterator, accum)
                if not window:
                    if state.batch_in_epoch == 0:  # an epoch without a single batch would repeat forever
                        raise ValueError(f"The train data yielded no batch in epoch {epoch}; check the dataset "
                                         "(an empty IterableDataset?).")
                    break
                last = len(window) - 1
                hf_items = hf_step.items(window) if hf_step is not None else None  # HF num_items_in_batch
                if counts_needed and (last or world > 1):
                    # item counts may be 0-dim tensors: weights stay tensors, so no host sync here
                    counts = [module.num_items(b) for b in window]
                    if any(c is None for c in counts):
                        weights = [1.0 / len(window)] * len(window)
                    elif even_counts and all(isinstance(c, int) for c in counts):
                        weights = [c / sum(counts) for c in counts]  # = c * W / (W * sum): same on every rank
                    elif world > 1:  # the window's items on every rank; DDP then averages over the W ranks
                        total = strategy.reduce(torch.as_tensor(sum(counts), dtype=torch.float32,
                                                                device=strategy.root_device), "sum").clamp(min=1)
                        weights = [c * world / total for c in counts]
                    else:
                        total = sum(counts)
                        total = total.clamp(min=1) if isinstance(total, torch.Tensor) else max(total, 1)
                        weights = [c / total for c in counts]
                else:
                    weights = None
                window_samples = 0
                for i, batch in enumerate(window):
                    batch = move(batch)
                    module._results.set_batch(batch)
                    batch_idx = state.batch_in_epoch
                    L["on_train_batch_start"] and hooks.call("on_train_batch_start", fit, module, batch, batch_idx)
                    if i == 0 and H["on_step_begin"]:
                        hooks.call_hf("on_step_begin", args, state, control, **run.hf_kwargs())
                    for opt in mode_optimizers:  # schedule-free: back to the train point after an evaluation (HF)
                        opt.train()
                    box: dict[str, Any] = {}
                    if manual:  # training_step runs backward and steps the optimizers itself
                        with fwd_ctx(), manual_outer_forward(strategy):
                            out = train_fx(batch, batch_idx)
                        loss = _manual_loss(out, strategy.root_device)
                    else:
                        def closure(i: int = i, batch: Any = batch, batch_idx: int = batch_idx,
                                    box: dict = box) -> torch.Tensor:
                            """Lightning's training closure: training_step, zero_grad (first micro-batch of a
                            window), backward."""
                            with strategy.no_backward_sync(enabled=i != last):
                                if hf_step is not None:  # zero_grad first: the override runs backward itself
                                    if i == 0:
                                        for opt in optimizers:
                                            opt.zero_grad(set_to_none=True)
                                    with fwd_ctx():
                                        out = loss = hf_step(batch, weights[i] if weights is not None else None,
                                                          hf_items)
                                    box["out"], box["loss"] = out, loss
                                    return loss
                                with fwd_ctx():
                                    out = train_fx(batch, batch_idx)
                                loss = _extract_training_loss(out)
                                if weights is not None:
                                    loss = loss * weights[i]
                                if i == 0:
                                    for opt in optimizers:
                                        L["on_before_zero_grad"] and hooks.call("on_before_zero_grad", fit, module,
                                                                                opt)
                                        if own_zero_grad:
                                            module.optimizer_zero_grad(epoch, batch_idx, opt)
                                        else:
                                            opt.zero_grad(set_to_none=True)
                                L["on_before_backward"] and hooks.call("on_before_backward", fit, module, loss)
                                if own_backward:
                                    module.backward(precision_scaled(precision, loss))
                                else:
                                    backward(loss)
                                L["on_after_backward"] and hooks.call("on_after_backward", fit, module)
                            box["out"], box["loss"] = out, loss
                            return loss.detach()

                        if own_step and i == last:  # the module's optimizer_step runs the closure (Lightning)
                            H["on_pre_optimizer_step"] and hooks.call_hf("on_pre_optimizer_step", args, state,
                                                                         control)
                            handles = [LightningOptimizer(opt, module, after_closure) for opt in optimizers]
                            for j, handle in enumerate(handles):
                                module.optimizer_step(epoch, batch_idx, handle,
                                                      closure if j == 0 else (lambda: box["loss"].detach()))
                            if "out" not in box:
                                raise RuntimeError("optimizer_step did not call optimizer_closure: call "
                                                   "optimizer.step(closure=optimizer_closure) or the closure itself.")
                            own_stepped = any(h.stepped for h in handles)
                        else:
                            closure()
                        out, loss = box["out"], box["loss"]
                    detached = loss.detach()
                    sums.tr_loss += detached  # per micro-batch, in HF's summation order
                    if record_loss is not None:  # HF's logging_nan_inf_filter, applied where the sum is read
                        record_loss(detached, sums.steps_since_log)
                    window_samples += infer_batch_size(batch)
                    state.batch_in_epoch += 1
                    outputs = batch_outputs(out, detached)
                    if i != last:
                        H["on_substep_end"] and hooks.call_hf("on_substep_end", args, state, control)
                        L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, outputs, batch,
                                                                batch_idx)
                        continue
                    # ---- optimizer step: once per window, every optimizer ----
                    if manual:
                        stepped = False
                    elif own_step:
                        stepped = own_stepped
                    else:
                        for opt in optimizers:
                            after_closure(opt)
                        H["on_pre_optimizer_step"] and hooks.call_hf("on_pre_optimizer_step", args, state, control)
                        stepped = optimizer_step(optimizer)
                        for opt in other_optimizers:
                            strategy.optimizer_step(opt)
                    H["on_optimizer_step"] and hooks.call_hf("on_optimizer_step", args, state, control)
                    self.step_lr = optimizer.param_groups[0]["lr"]  # the rate this step used (HF 5 logs it)
                    if stepped:  # Lightning: every `frequency` batches of the epoch (HF: every step)
                        for cfg in step_schedulers:
                            if (batch_idx + 1) % cfg.frequency == 0:
                                self._step_scheduler(cfg)
                    if not manual and state.batch_in_epoch == batches_per_epoch:  # Lightning: the epoch's last
                        for cfg in epoch_schedulers:  # batch steps them (not an epoch cut short by max_steps)
                            if (epoch + 1) % cfg.frequency == 0:
                                self._step_scheduler(cfg)
                    sums.steps_since_log += 1
                    state.global_step += 1
                    state.epoch = epoch + (state.batch_in_epoch / batches_per_epoch if batches_per_epoch else 0.0)
                    state.samples_seen += window_samples * readers  # every data-parallel rank takes as many
                    state.total_flos += flos_per_sample * window_samples * readers
                    L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, outputs, batch, batch_idx)
                    self._after_step(epoch_end=False)
                if control.should_training_stop or control.should_epoch_stop:
                    break
            if not (control.should_training_stop or control.should_epoch_stop):
                state.epoch = float(epoch + 1)  # the epoch ran to its end
            if not manual and batches_per_epoch is None:  # a loader without length: at the end of the epoch
                for cfg in epoch_schedulers:
                    if (epoch + 1) % cfg.frequency == 0:
                        self._step_scheduler(cfg)
            H["on_epoch_end"] and hooks.call_hf("on_epoch_end", args, state, control, **run.hf_kwargs())
            self._after_step(epoch_end=True, save=False)  # the epoch's loss row and validation (Lightning: before
            defaults, module._log_defaults = module._log_defaults, (False, True)  # Lightning's epoch-end defaults
            try:
                hooks.call("on_train_epoch_end", fit, module)  # on_train_epoch_end, which may log epoch values)
            finally:
                module._log_defaults = defaults
            epoch_values = module._results.epoch_values()
            hidden = module._results.hidden_names()
            epoch_logs = {k: v for k, v in epoch_values.items() if k not in hidden}
            if epoch_logs:
                self._log(epoch_logs)
            # callback_metrics (Lightning): logger=False values too, and `name` for `name_epoch`
            fit.callback_metrics.update(epoch_values)
            fit.callback_metrics.update({k[:-len("_epoch")]: v for k, v in epoch_values.items()
                                         if k.endswith("_epoch")})
            sums.epoch_done = True  # a checkpoint from here on resumes at the start of the next epoch
            if control.should_save:
                self._save(run.training_state.state_dict())
            control._new_step()
            for cfg in () if manual else plateau_epoch:  # after validation, on the epoch's metrics (Lightning)
                if (epoch + 1) % cfg.frequency == 0:
                    self._step_scheduler(cfg)
            sums.epoch_done = False
            if control.should_training_stop:
                break
        if sums.steps_since_log:
            sums.total_loss += float(self._global_tr_loss())

    def _monitor_values(self) -> dict[str, Any]:
        """What a ``ReduceLROnPlateau`` may monitor (Lightning's ``callback_metrics``): logged rows, the latest
        ``self.log`` step values and the running epoch aggregates."""
        out = dict(self.owner.callback_metrics)
        results = self.run.module._results
        for e in results.values.values():
            if e.on_step and e.last is not None:
                out[f"{e.name}_step" if e.on_epoch else e.name] = e.last
        epoch = results.epoch_values()
        out.update(epoch)
        for key, value in epoch.items():
            if key.endswith("_epoch"):
                out[key[:-len("_epoch")]] = value
        return out

    def _step_scheduler(self, cfg: Any) -> None:
        """Step one scheduler; a ``ReduceLROnPlateau`` with its monitored value (missing: raise when ``strict``,
        else warn and skip, as Lightning)."""
        module = self.run.module
        own = overrides(module, "lr_scheduler_step")
        if not cfg.reduce_on_plateau:
            module.lr_scheduler_step(cfg.scheduler, None) if own else cfg.scheduler.step()
            return
        values = self._monitor_values()
        if cfg.monitor not in values:
            if cfg.strict:
                raise KeyError(f"ReduceLROnPlateau conditioned on metric {cfg.monitor!r}, which is not available. "
                               f"Available metrics are: {sorted(values)}. Set it with the 'monitor' key of the "
                               "lr_scheduler config.")
            import warnings

            warnings.warn(f"ReduceLROnPlateau conditioned on metric {cfg.monitor!r}, which is not available but "
                          "strict is set to False. Skipping learning rate update.", RuntimeWarning, stacklevel=2)
            return
        value = float(values[cfg.monitor])
        module.lr_scheduler_step(cfg.scheduler, value) if own else cfg.scheduler.step(value)

    def _after_step(self, epoch_end: bool, save: bool = True) -> None:
        """Set and act on the log / evaluate / save / stop flags (mirrors HF ``DefaultFlowCallback`` +
        ``_maybe_log_save_evaluate``); with ``save=False`` the save flag is left for the caller."""
        run, args, hooks, sums = self.run, self.args, self.hooks, self.sums
        state, control = run.state, run.control
        step = state.global_step
        signum = self.stop.poll() if self.stop is not None and not epoch_end else 0
        if signum:  # SIGTERM / Ctrl-C / SLURM requeue: this step is the last one
            control.should_training_stop = True
            control.should_save = control.should_save or self.stop.should_save(signum)
        if not epoch_end:
            if args.logging_strategy == "steps" and (step % state.logging_steps == 0
                                                     or (step == 1 and args.logging_first_step)):
                control.should_log = True
            if args.eval_strategy == "steps" and step % state.eval_steps == 0 and (args.eval_delay or 0) <= step:
                control.should_evaluate = True
            if args.save_strategy == "steps" and step % state.save_steps == 0:
                control.should_save = True
            if step >= state.max_steps:
                control.should_training_stop = True
                control.should_save = control.should_save or args.save_strategy == "steps"  # HF: save at the end
                if args.eval_strategy == "steps" and step % state.eval_steps and (args.eval_delay or 0) <= step:
                    control.should_evaluate = True  # HF 5: a last evaluation when max_steps is off the grid
            if hooks.hf["on_step_end"]:
                hooks.call_hf("on_step_end", args, state, control, **run.hf_kwargs())
        else:
            if args.logging_strategy == "epoch":
                control.should_log = True
            if args.eval_strategy == "epoch" and (args.eval_delay or 0) <= state.epoch:
                control.should_evaluate = True
            if args.save_strategy == "epoch":
                control.should_save = True
        if self._norm_due is not None and (control.should_log or control.should_save):  # kept otherwise: an
            (params, optimizer), self._norm_due = self._norm_due, None  # epoch-end log row may still read it; the
            sums.grad_norm = self.strategy.clip_gradients(params, math.inf, optimizer)  # step's gradients are intact
        if control.should_log and sums.steps_since_log:
            tr_loss = float(self._global_tr_loss())
            loss = tr_loss / sums.steps_since_log
            sums.total_loss += tr_loss
            sums.tr_loss.zero_()
            sums.steps_since_log = 0
            sums.nan_filter.reset()
            logs = {"loss": loss}  # unrounded, as HF 5
            if sums.grad_norm is not None:
                logs["grad_norm"] = float(sums.grad_norm)
            step_lr = getattr(self, "step_lr", None)
            logs["learning_rate"] = step_lr if step_lr is not None else run.optimizer.param_groups[0]["lr"]
            logs.update(self.strategy.precision.log_values())  # 16-mixed: loss_scale, skipped_steps
            logs.update(run.module._results.step_values())
            self._log(logs)
        if control.should_log or control.should_save:  # the only host sync it adds: on logging and save steps
            check_finite(self.strategy, run.module, step, args.output_dir)  # after the log row, before a save
        if control.should_evaluate:
            self._evaluate()
        if not save:
            return
        if control.should_save:
            self._save(run.training_state.state_dict())
        if signum:
            raise self.stop.stop(self.strategy.checkpoint_io, args.output_dir, step, self.strategy.is_global_zero)
        control._new_step()

    def _global_tr_loss(self) -> torch.Tensor:
        """The loss sum since the last log, averaged over processes (each holds its share of the window)."""
        strategy, sums = self.strategy, self.sums
        sums.nan_filter.apply(sums.tr_loss, sums.steps_since_log)  # a host sync follows anyway
        return strategy.reduce(sums.tr_loss, "mean") if strategy.world_size > 1 else sums.tr_loss

    @property
    def training_loss(self) -> float:
        """Mean loss per optimizer step over the whole run (HF ``TrainOutput.training_loss``)."""
        steps = self.run.state.global_step - self.sums.loss_start_step
        return self.sums.total_loss / steps if steps else math.nan
