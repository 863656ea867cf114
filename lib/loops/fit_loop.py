"""The fit loop: epochs, accumulation windows, clipping, optimizer/scheduler steps and the log / evaluate /
save triggers (F-LOOP-1..3, F-LOOP-6). One optimizer step = one window of ``gradient_accumulation_steps``
micro-batches (the last window of an epoch may be shorter)."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from taskfit.data.loaders import set_loader_epoch, skip_first_batches
from taskfit.loops.finite import check_finite
from taskfit.module import infer_batch_size
from taskfit.seed import set_rng_states

if TYPE_CHECKING:
    from taskfit.fit import Fit


def _extract_training_loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, Mapping) else out
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


def resolve_interval(value: float | None, max_steps: int) -> int:
    """HF rule for ``logging_steps``/``eval_steps``/``save_steps``: a value < 1 is a ratio of ``max_steps``."""
    if value is None:
        return max_steps
    return max(1, math.ceil(value * max_steps)) if value < 1 else int(value)


def plan_steps(loader: Any, args: Any) -> tuple[int | None, int, int]:
    """``(steps_per_epoch, max_steps, num_epochs)`` for a training loader (HF ``max_steps`` rules: ``max_steps``
    > 0 wins, else ``ceil(num_train_epochs * steps_per_epoch)``; the last window of an epoch may be short).

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
    steps_per_epoch = math.ceil(n_batches / args.gradient_accumulation_steps) if n_batches else None
    if args.max_steps and args.max_steps > 0:
        max_steps = args.max_steps
    elif steps_per_epoch is None:
        raise ValueError("The train data has no length (IterableDataset); set max_steps > 0.")
    else:
        max_steps = max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
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
    """Drives training for one ``Fit.fit`` call; ``Fit`` owns the objects, this class owns the order.

    Args:
        fit (Fit): the run, already set up (module on device, optimizer, scheduler, loaders, state).
    """

    def __init__(self, fit: Fit) -> None:
        self.fit = fit
        self.tr_loss = torch.zeros(())  # losses since the last log, summed per optimizer step
        self.total_loss = 0.0            # sum of all logged step losses (host float)
        self.steps_since_log = 0
        self.grad_norm: torch.Tensor | None = None
        self.loss_start_step = fit._start_step  # total_loss covers the steps from here on
        self.epoch_done = False

    def state_dict(self) -> dict[str, Any]:
        """The running loss sums, saved in checkpoints so a resumed run logs exactly the same losses."""
        return {"tr_loss": self.tr_loss.detach().cpu().clone(), "steps_since_log": self.steps_since_log,
                "total_loss": self.total_loss, "epoch_done": self.epoch_done,
                "grad_norm": None if self.grad_norm is None else self.grad_norm.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the sums then cover the whole run from step 0)."""
        if not state:
            return
        self.tr_loss = state["tr_loss"].to(self.tr_loss.device)
        self.steps_since_log, self.total_loss = int(state["steps_since_log"]), float(state["total_loss"])
        self.grad_norm = state["grad_norm"]
        self.loss_start_step = 0

    def run(self, loader: Any, steps_per_epoch: int | None, num_epochs: int) -> None:
        """Train until ``state.max_steps`` or ``num_epochs`` or a stop flag."""
        fit = self.fit
        state, control, args, hooks = fit.state, fit.control, fit.args, fit._hooks
        # first: through the DDP/FSDP wrapper's forward; DeepSpeed builds its engine here and may replace
        # fit.optimizer / fit.lr_scheduler with its own
        train_fx = fit.strategy.step_function(fit.module, "training_step")
        module, strategy, optimizer = fit.module, fit.strategy, fit.optimizer
        L, H = hooks.lightning, hooks.hf
        accum = args.gradient_accumulation_steps
        max_norm = args.max_grad_norm
        params = [p for p in module.parameters() if p.requires_grad]
        step_scheduler = fit.lr_scheduler is not None and fit.scheduler_interval == "step"
        nan_filter = args.logging_nan_inf_filter
        self.tr_loss = torch.zeros((), device=strategy.root_device)
        world = strategy.world_size
        fwd_ctx = strategy.forward_context
        counts_needed = accum > 1 or world > 1

        try:
            batches_per_epoch = len(loader)
        except TypeError:
            batches_per_epoch = None
        resume, fit._resume_point = fit._resume_point, None
        if resume is not None:
            self.load_state_dict(resume.loop)
            if state.global_step >= state.max_steps:  # resumed from the end of the run: nothing left to do
                return
        for epoch in range(state.current_epoch, num_epochs):
            skip = resume.skip_batches if resume is not None else 0
            if resume is not None and not skip and resume.rng is not None:
                set_rng_states(resume.rng)  # saved at an epoch boundary: the saved run was about to start this epoch
            state.current_epoch = epoch
            set_loader_epoch(fit.train_loader, epoch)
            control._new_epoch()
            if not skip:  # resumed mid-epoch: keep the restored epoch aggregates
                module._results.reset_epoch()
            hooks.call("on_train_epoch_start", fit, module)
            H["on_epoch_begin"] and hooks.call_hf("on_epoch_begin", args, state, control, **fit._hf_kwargs())
            iterator = iter(skip_first_batches(loader, skip))
            state.batch_in_epoch = skip
            if skip and resume.rng is not None:
                set_rng_states(resume.rng)  # saved mid-epoch: after the epoch's iterator existed, as in the saved run
            resume = None
            while True:
                window = _window(iterator, accum)
                if not window:
                    if state.batch_in_epoch == 0:  # an epoch without a single batch would repeat forever
                        raise ValueError(f"The train data yielded no batch in epoch {epoch}; check the dataset "
                                         "(an empty IterableDataset?).")
                    break
                last = len(window) - 1
                if counts_needed and (last or world > 1):
                    # item counts may be 0-dim tensors: weights stay tensors, so no host sync here
                    counts = [module.num_items(b) for b in window]
                    if any(c is None for c in counts):
                        weights = [1.0 / len(window)] * len(window)
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
                step_loss, window_samples = None, 0
                for i, batch in enumerate(window):
                    batch = strategy.batch_to_device(batch)
                    module._results.set_batch(batch)
                    batch_idx = state.batch_in_epoch
                    L["on_train_batch_start"] and hooks.call("on_train_batch_start", fit, module, batch, batch_idx)
                    if i == 0 and H["on_step_begin"]:
                        hooks.call_hf("on_step_begin", args, state, control, **fit._hf_kwargs())
                    with strategy.no_sync(i == last):
                        with fwd_ctx():
                            out = train_fx(batch, batch_idx)
                        loss = _extract_training_loss(out)
                        if weights is not None:
                            loss = loss * weights[i]
                        L["on_before_backward"] and hooks.call("on_before_backward", fit, module, loss)
                        strategy.backward(loss)
                        L["on_after_backward"] and hooks.call("on_after_backward", fit, module)
                    detached = loss.detach()
                    step_loss = detached if step_loss is None else step_loss + detached
                    window_samples += infer_batch_size(batch)
                    state.batch_in_epoch += 1
                    if i != last:
                        H["on_substep_end"] and hooks.call_hf("on_substep_end", args, state, control)
                        L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, out, batch, batch_idx)
                        continue
                    # ---- optimizer step: once per window ----
                    strategy.precision.unscale_gradients(optimizer)  # before the hook and clipping (Lightning)
                    L["on_before_optimizer_step"] and hooks.call("on_before_optimizer_step", fit, module, optimizer)
                    if max_norm and max_norm > 0:
                        self.grad_norm = strategy.clip_gradients(params, max_norm, optimizer)
                    H["on_pre_optimizer_step"] and hooks.call_hf("on_pre_optimizer_step", args, state, control)
                    stepped = strategy.optimizer_step(optimizer)
                    H["on_optimizer_step"] and hooks.call_hf("on_optimizer_step", args, state, control)
                    if step_scheduler and stepped:
                        fit.lr_scheduler.step()
                    L["on_before_zero_grad"] and hooks.call("on_before_zero_grad", fit, module, optimizer)
                    optimizer.zero_grad(set_to_none=True)
                    if nan_filter:
                        step_loss = torch.where(torch.isfinite(step_loss), step_loss,
                                                self.tr_loss / max(1, self.steps_since_log))
                    self.tr_loss += step_loss
                    self.steps_since_log += 1
                    state.global_step += 1
                    state.epoch = epoch + (state.batch_in_epoch / batches_per_epoch if batches_per_epoch else 0.0)
                    state.samples_seen += window_samples * world  # every rank takes as many samples
                    state.total_flos += fit._flos_per_sample * window_samples * world
                    L["on_train_batch_end"] and hooks.call("on_train_batch_end", fit, module, out, batch, batch_idx)
                    self._after_step(epoch_end=False)
                if control.should_training_stop or control.should_epoch_stop:
                    break
            if not (control.should_training_stop or control.should_epoch_stop):
                state.epoch = float(epoch + 1)  # the epoch ran to its end
            if fit.lr_scheduler is not None and fit.scheduler_interval == "epoch":
                fit.lr_scheduler.step()
            hooks.call("on_train_epoch_end", fit, module)
            H["on_epoch_end"] and hooks.call_hf("on_epoch_end", args, state, control, **fit._hf_kwargs())
            epoch_logs = module._results.epoch_values(logger_only=True)
            if epoch_logs:
                fit._log(epoch_logs)
            self.epoch_done = True  # a checkpoint from here on resumes at the start of the next epoch
            self._after_step(epoch_end=True)
            self.epoch_done = False
            if control.should_training_stop:
                break
        if self.steps_since_log:
            self.total_loss += float(self._global_tr_loss())

    def _after_step(self, epoch_end: bool) -> None:
        """Set and act on the log / evaluate / save / stop flags (mirrors HF ``DefaultFlowCallback`` +
        ``_maybe_log_save_evaluate``)."""
        fit = self.fit
        state, control, args, hooks = fit.state, fit.control, fit.args, fit._hooks
        step = state.global_step
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
            if hooks.hf["on_step_end"]:
                hooks.call_hf("on_step_end", args, state, control, **fit._hf_kwargs())
        else:
            if args.logging_strategy == "epoch":
                control.should_log = True
            if args.eval_strategy == "epoch" and (args.eval_delay or 0) <= state.epoch:
                control.should_evaluate = True
            if args.save_strategy == "epoch":
                control.should_save = True
        if control.should_log and self.steps_since_log:
            tr_loss = float(self._global_tr_loss())
            loss = tr_loss / self.steps_since_log
            self.total_loss += tr_loss
            self.tr_loss.zero_()
            self.steps_since_log = 0
            logs = {"loss": round(loss, 6)}
            if self.grad_norm is not None:
                logs["grad_norm"] = float(self.grad_norm)
            logs["learning_rate"] = fit.optimizer.param_groups[0]["lr"]
            logs.update(fit.strategy.precision.log_values())  # 16-mixed: loss_scale, skipped_steps
            logs.update(fit.module._results.step_values())
            fit._log(logs)
        if control.should_log or control.should_save:  # the only host sync it adds: on logging and save steps
            check_finite(fit.strategy, fit.module, step, fit.args.output_dir)  # after the log row, before a save
        if control.should_evaluate:
            fit._evaluate_during_fit()
        if control.should_save:
            fit._save_checkpoint(self.state_dict())
        control._new_step()

    def _global_tr_loss(self) -> torch.Tensor:
        """The loss sum since the last log, averaged over processes (each holds its share of the window)."""
        strategy = self.fit.strategy
        return strategy.reduce(self.tr_loss, "mean") if strategy.world_size > 1 else self.tr_loss

    @property
    def training_loss(self) -> float:
        """Mean loss per optimizer step over the whole run (HF ``TrainOutput.training_loss``)."""
        steps = self.fit.state.global_step - self.loss_start_step
        return self.total_loss / steps if steps else math.nan
