"""Stochastic Weight Averaging (mirrors Lightning's ``StochasticWeightAveraging``), on the
``torch.optim.swa_utils.AveragedModel`` of :class:`~taskfit.callbacks.weight_averaging.WeightAveraging`."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from taskfit.callbacks.base import Callback
from taskfit.callbacks.weight_averaging import WeightAveraging


def swa_avg_fn(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
    """The equal-weight running mean ``averaged + (current - averaged) / (num_averaged + 1)`` (Lightning's and
    PyTorch's SWA formula, written out so the rounding is theirs)."""
    return averaged + (current - averaged) / (num_averaged + 1)


class StochasticWeightAveraging(WeightAveraging):
    """From epoch ``swa_epoch_start`` on, the learning rate follows ``torch.optim.swa_utils.SWALR`` (annealed to
    ``swa_lrs`` over ``annealing_epochs`` epochs; it replaces the module's scheduler) and the weights are averaged
    once per epoch. When the last epoch has run, the averaged weights are copied into the module and, when it
    has BatchNorm layers, their statistics are recomputed with one pass of ``training_step`` over the train loader
    (no backward, no optimizer step). So ``save_model`` after ``fit`` writes the averaged weights. Checkpoints
    hold the training weights, the average, its count and the SWALR state: a resume mid-SWA continues exactly.

    Mirrors ``lightning.pytorch.callbacks.StochasticWeightAveraging`` with its timing: the average takes the
    weights at the *start* of epochs ``swa_epoch_start - 1`` .. ``max_epochs - 1`` (0-based), and a run stopped
    before its last epoch (early stopping, timer) keeps its training weights. Lightning runs the BatchNorm pass as
    an extra training epoch; taskfit runs it inside ``on_train_end`` (the same batches, no extra epoch counted).

    Args:
        swa_lrs (float | list[float]): the SWA learning rate, one for all parameter groups or one per group.
        swa_epoch_start (int | float): epoch (int >= 1) or fraction of ``max_epochs`` in (0, 1] where SWA starts.
        annealing_epochs (int): epochs of annealing from the current rate to ``swa_lrs`` (>= 0).
        annealing_strategy (str): ``"cos"`` or ``"linear"``.
        avg_fn (Callable | None): ``(averaged, current, num_averaged) -> tensor``; None: equal-weight mean.
        device (torch.device | str | None): where the average lives (None: the module's device).

    Raises:
        ValueError: a bad argument (naming it and the valid values); at fit start, a sharded strategy (FSDP,
            DeepSpeed: the average needs whole weights), more than one optimizer or scheduler, or a float
            ``swa_epoch_start`` without a known number of epochs.
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: str = "cos", avg_fn: Callable | None = None,
                 device: torch.device | str | None = torch.device("cpu")) -> None:
        start_ok = (isinstance(swa_epoch_start, int) and not isinstance(swa_epoch_start, bool)
                    and swa_epoch_start >= 1) or (isinstance(swa_epoch_start, float) and 0 < swa_epoch_start <= 1)
        if not start_ok:
            raise ValueError(f"StochasticWeightAveraging swa_epoch_start={swa_epoch_start!r} must be an int >= 1 "
                             "or a float in (0, 1].")
        lrs = swa_lrs if isinstance(swa_lrs, (list, tuple)) else [swa_lrs]
        if not lrs or any(not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0 for lr in lrs):
            raise ValueError(f"StochasticWeightAveraging swa_lrs={swa_lrs!r} must be a positive float or a list of "
                             "positive floats (one per parameter group).")
        if not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError(f"StochasticWeightAveraging annealing_epochs={annealing_epochs!r} must be an int >= 0.")
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError(f"StochasticWeightAveraging annealing_strategy={annealing_strategy!r}; choose 'cos' "
                             "or 'linear'.")
        if avg_fn is not None and not callable(avg_fn):
            raise ValueError("StochasticWeightAveraging avg_fn must be callable (averaged, current, n) -> tensor.")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise ValueError(f"StochasticWeightAveraging device={device!r} must be a torch.device, a str or None.")
        super().__init__(device=device, use_buffers=False, avg_fn=avg_fn or swa_avg_fn)
        self._swa_epoch_start_arg = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._swa_epoch_start = swa_epoch_start if isinstance(swa_epoch_start, int) else 0
        self._max_epochs = 0
        self._has_batch_norm = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict[str, Any] | None = None
        self._initialized = False

    # validation runs on the training weights (Lightning's SWA does not swap them in)
    on_validation_epoch_start = Callback.on_validation_epoch_start
    on_validation_epoch_end = Callback.on_validation_epoch_end
    on_train_batch_end = Callback.on_train_batch_end
    on_train_epoch_end = Callback.on_train_epoch_end

    @property
    def swa_start(self) -> int:
        """First averaged epoch (0-based): ``swa_epoch_start - 1``."""
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> int:
        """Last averaged epoch (0-based): ``max_epochs - 1``."""
        return self._max_epochs - 1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return False  # updates happen at epoch starts, below

    def setup(self, fit: Any, module: Any, stage: str) -> None:
        if stage == "fit" and fit.strategy.engine_owns_step:
            raise ValueError(f"StochasticWeightAveraging replaces the LR schedule, which "
                             f"{type(fit.strategy).__name__}'s engine owns; use DDP or a single device.")
        super().setup(fit, module, stage)  # refuses sharded parameters (FSDP, ZeRO-3), as Lightning
        self._initialized = False

    def on_fit_start(self, fit: Any, module: Any) -> None:
        run = fit.run
        if len(run.optimizers) != 1:
            raise ValueError(f"StochasticWeightAveraging works with 1 optimizer; the module has {len(run.optimizers)}.")
        if len(run.schedulers) > 1:
            raise ValueError(f"StochasticWeightAveraging works with at most 1 LR scheduler; the module has "
                             f"{len(run.schedulers)}.")
        self._max_epochs = fit.state.num_train_epochs
        if not self._max_epochs:
            raise ValueError("StochasticWeightAveraging needs a known number of epochs (a train loader with a "
                             "length); with max_steps on an IterableDataset, SWA has no epochs to average.")
        if isinstance(self._swa_epoch_start_arg, float):
            self._swa_epoch_start = int(self._max_epochs * self._swa_epoch_start_arg)
        self._has_batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
        if self._scheduler_state is not None:  # resumed mid-SWA: the SWALR is rebuilt from its state below
            run.schedulers.clear()

    def on_train_epoch_start(self, fit: Any, module: Any) -> None:
        epoch = fit.state.current_epoch
        if not self._initialized and self.swa_start <= epoch <= self.swa_end:
            self._initialized = True
            self._start_swa(fit, module)
        if self.swa_start <= epoch <= self.swa_end and epoch > self._latest_update_epoch:
            self._average_model.update_parameters(module)
            self._latest_update_epoch = epoch

    def _start_swa(self, fit: Any, module: Any) -> None:
        from torch.optim.swa_utils import SWALR

        from taskfit.optim.configure import SchedulerConfig

        run = fit.run
        optimizer = run.optimizers[0]
        lrs = list(self._swa_lrs) if isinstance(self._swa_lrs, (list, tuple)) else (
            [self._swa_lrs] * len(optimizer.param_groups))
        if len(lrs) != len(optimizer.param_groups):
            raise ValueError(f"StochasticWeightAveraging swa_lrs has {len(lrs)} values for "
                             f"{len(optimizer.param_groups)} parameter groups.")
        for lr, group in zip(lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        # Lightning counts the BatchNorm epoch in max_epochs; last_epoch is only a counter in SWALR's state
        last = self._max_epochs + int(self._has_batch_norm) if self._annealing_strategy == "cos" else -1
        self._swa_scheduler = SWALR(optimizer, swa_lr=lrs, anneal_epochs=self._annealing_epochs,
                                    anneal_strategy=self._annealing_strategy, last_epoch=last)
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
            self._scheduler_state = None
        config = SchedulerConfig(self._swa_scheduler, interval="epoch", frequency=1)
        if run.schedulers:  # the loop reads the schedulers at every epoch start
            run.schedulers[0] = config
        else:
            run.schedulers.append(config)

    def on_train_end(self, fit: Any, module: Any) -> None:
        if self._average_model is None or self._max_epochs == 0 or fit.state.epoch < self._max_epochs:
            return  # stopped before the last epoch ended: the training weights stay (Lightning)
        for avg, cur in zip(self._average_model.module.parameters(), module.parameters()):
            cur.detach().copy_(avg.to(cur.device))
        if self._has_batch_norm:
            self._update_batch_norm(fit, module)

    @staticmethod
    def _update_batch_norm(fit: Any, module: Any) -> None:
        """Recompute BatchNorm running statistics of the averaged weights: reset them, then one forward pass of
        ``training_step`` over the train loader with momentum None (a cumulative mean), as Lightning's extra
        epoch and ``torch.optim.swa_utils.update_bn``."""
        from taskfit.core.hooks import batch_mover

        momenta = {}
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean = torch.zeros_like(m.running_mean)
                m.running_var = torch.ones_like(m.running_var)
                momenta[m] = m.momentum
                m.momentum = None
                m.num_batches_tracked *= 0
        move = batch_mover(module, fit.strategy)
        was_training = module.training
        module.train()
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(fit.run.train_loader):
                    batch = move(batch)
                    module._results.set_batch(batch)
                    module.training_step(batch, batch_idx)
        finally:
            module.train(was_training)
            for m, momentum in momenta.items():
                m.momentum = momentum

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["scheduler_state"] = None if self._swa_scheduler is None else self._swa_scheduler.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._scheduler_state = state_dict.get("scheduler_state")
