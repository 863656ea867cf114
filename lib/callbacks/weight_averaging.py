"""Weight averaging with ``torch.optim.swa_utils.AveragedModel``: a general callback and its EMA form (mirror
Lightning's ``WeightAveraging`` and ``EMAWeightAveraging``)."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from taskfit.callbacks.base import Callback


class WeightAveraging(Callback):
    """Keep an ``AveragedModel`` of the module, updated after optimizer steps / epochs (``should_update``).
    Validation runs on the averaged weights; when training ends they are copied into the module, so
    ``save_model`` writes them. Checkpoints hold the training weights (as ``model.safetensors``) and the averaged
    model in this callback's state, so a resume continues both exactly.

    Args:
        device (torch.device | str | None): where the average lives (None: the module's device).
        use_buffers (bool): average buffers too (``AveragedModel(use_buffers=...)``).
        **kwargs: passed to ``AveragedModel`` (``avg_fn``, ``multi_avg_fn``).
    """

    def __init__(self, device: Any = None, use_buffers: bool = True, **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers, self._kwargs = use_buffers, kwargs
        self._average_model: Any = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._pending: dict[str, Any] | None = None

    @property
    def average_model(self) -> Any:
        """The ``AveragedModel`` (None outside fit)."""
        return self._average_model

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """After every optimizer step (``step_idx``, 0-based) by default; override to choose."""
        return step_idx is not None

    def setup(self, fit: Any, module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if fit.strategy.shards_parameters:  # Lightning: "sharded models do not work" with its weight averaging
            raise ValueError(f"{type(self).__name__} keeps a full copy of the weights and averages whole tensors; "
                             f"it does not support sharded parameters ({type(fit.strategy).__name__}): use DDP, "
                             "a single device, or DeepSpeed ZeRO stage 1/2.")
        from torch.optim.swa_utils import AveragedModel

        device = self._device or next(module.parameters()).device
        self._average_model = AveragedModel(module, device=device, use_buffers=self._use_buffers, **self._kwargs)
        if self._pending is not None:  # restored from a checkpoint before setup
            self._average_model.load_state_dict(self._pending)
            self._pending = None

    def on_train_batch_end(self, fit: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = fit.state.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._average_model.update_parameters(module)
            self._latest_update_step = step

    def on_train_epoch_end(self, fit: Any, module: Any) -> None:
        epoch = fit.state.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._average_model.update_parameters(module)
            self._latest_update_epoch = epoch

    def on_train_end(self, fit: Any, module: Any) -> None:
        if self._average_model is not None:
            for avg, cur in self._pairs(module):
                cur.data.copy_(avg.data)

    def on_validation_epoch_start(self, fit: Any, module: Any) -> None:
        if self._average_model is not None and fit.run is not None and fit.run.stage == "fit":
            self._swap(module)

    def on_validation_epoch_end(self, fit: Any, module: Any) -> None:
        if self._average_model is not None and fit.run is not None and fit.run.stage == "fit":
            self._swap(module)

    def _pairs(self, module: Any) -> Any:
        avg = self._average_model.module
        return zip(itertools.chain(avg.parameters(), avg.buffers()),
                   itertools.chain(module.parameters(), module.buffers()))

    def _swap(self, module: Any) -> None:
        for avg, cur in self._pairs(module):
            tmp = avg.data.clone()
            avg.data.copy_(cur.data)
            cur.data.copy_(tmp)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"latest_update_step": self._latest_update_step,
                               "latest_update_epoch": self._latest_update_epoch}
        if self._average_model is not None:
            out["average_model"] = {k: v.detach().cpu().clone() for k, v in self._average_model.state_dict().items()}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict.get("latest_update_step", 0)
        self._latest_update_epoch = state_dict.get("latest_update_epoch", -1)
        saved = state_dict.get("average_model")
        if saved is not None:
            if self._average_model is not None:
                self._average_model.load_state_dict(saved)
            else:
                self._pending = saved


class EMAWeightAveraging(WeightAveraging):
    """Exponential moving average of the weights (``torch.optim.swa_utils.get_ema_avg_fn(decay)``).

    Args:
        decay (float): EMA decay in [0, 1].
        update_every_n_steps (int): update after every N-th optimizer step.
        update_starting_at_step (int | None), update_starting_at_epoch (int | None): first step / epoch (0-based)
            that updates.
        device, use_buffers, **kwargs: as :class:`WeightAveraging`.

    Raises:
        ValueError: ``decay`` outside [0, 1]; at fit start, a strategy that shards parameters.
    """

    def __init__(self, device: Any = None, use_buffers: bool = True, decay: float = 0.999,
                 update_every_n_steps: int = 1, update_starting_at_step: int | None = None,
                 update_starting_at_epoch: int | None = None, **kwargs: Any) -> None:
        if not 0 <= decay <= 1:
            raise ValueError(f"EMAWeightAveraging decay={decay!r} must be in [0, 1].")
        from torch.optim.swa_utils import get_ema_avg_fn

        super().__init__(device=device, use_buffers=use_buffers, avg_fn=get_ema_avg_fn(decay=decay), **kwargs)
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            if (self.update_starting_at_step is None or step_idx >= self.update_starting_at_step) and (
                    self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0):
                return True
        return epoch_idx is not None and self.update_starting_at_epoch is not None and (
            epoch_idx >= self.update_starting_at_epoch)
