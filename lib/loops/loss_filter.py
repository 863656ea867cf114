"""HF's ``logging_nan_inf_filter`` applied lazily: the fit loop adds every optimizer step's loss to its running
sum unfiltered (one device op per step), and the filter is applied only where the sum is read, which is a host
sync anyway (a logging step, a checkpoint, the end of training). There a single finiteness check of the sum
decides: all step losses were finite (the sum is, the usual case) and the sum is exact as it is; otherwise the
steps since the sum was last read are replayed with the filter, giving the same float32 values as filtering every
step eagerly.

Filtering eagerly costs ``isfinite`` + a division + ``where`` per step (about 10 µs on a CPU, a sizeable part of a
small model's step); recording the step loss here costs a list append.
"""

from __future__ import annotations

import torch

#: step losses kept as separate tensors before they are stacked into one (bounds the number of objects)
_CHUNK = 1024


class NonFiniteLossFilter:
    """Replays the step losses added since the running sum was last read, replacing each non-finite one by the
    mean of the sum before it (mirrors HF ``Trainer``: ``tr_loss / (1 + global_step - last_logged_step)``).

    Memory: 4 bytes per optimizer step since the last read (stacked per 1,024 steps), on the loss's device.
    """

    def __init__(self) -> None:
        self._base: tuple[torch.Tensor | None, int] = (None, 0)  # the sum (None: zero) and its steps at the start
        self._chunks: list[torch.Tensor] = []
        self._pending: list[torch.Tensor] = []

    def reset(self, base_sum: torch.Tensor | None = None, base_steps: int = 0) -> None:
        """Start a new interval from ``base_sum`` (a 0-dim tensor, copied; None: zero) after ``base_steps`` steps."""
        self._base = (None if base_sum is None else base_sum.detach().clone(), int(base_steps))
        self._chunks, self._pending = [], []

    def add(self, step_loss: torch.Tensor) -> None:
        """Record one optimizer step's (detached, 0-dim) loss; no device work except one stack per 1,024 steps."""
        pending = self._pending
        pending.append(step_loss)
        if len(pending) >= _CHUNK:
            self._chunks.append(torch.stack(pending))
            self._pending = []

    def apply(self, running_sum: torch.Tensor, steps: int) -> torch.Tensor:
        """Filter ``running_sum`` (the unfiltered sum over ``steps`` steps since the last reset) in place and
        return it; the next interval starts from the filtered value. Syncs with the device once when steps were
        recorded (only call it where the sum is read on the host anyway).
        """
        if not self._pending and not self._chunks:
            return running_sum
        if not bool(torch.isfinite(running_sum)):  # some step was non-finite: replay them with the filter
            base, n = self._base
            total = torch.zeros_like(running_sum) if base is None else base.to(running_sum.device).clone()
            losses = [x for chunk in self._chunks for x in chunk.unbind()] + self._pending
            for x in losses:
                total += torch.where(torch.isfinite(x), x, total / max(1, n))
                n += 1
            running_sum.copy_(total)
        self.reset(running_sum, steps)
        return running_sum
