"""HF's ``logging_nan_inf_filter`` applied lazily: the fit loop adds every micro-batch's loss to its running sum
unfiltered (one device op per micro-batch, in HF's summation order), and the filter is applied only where the sum
is read, which is a host sync anyway (a logging step, a checkpoint, the end of training). There a single
finiteness check of the sum decides: all losses were finite (the sum is, the usual case) and the sum is exact as it
is; otherwise the micro-batches since the sum was last read are replayed with the filter, giving the same float32
values as filtering each one eagerly as HF does.

Filtering eagerly costs ``isfinite`` + a division + ``where`` per micro-batch (about 10 µs on a CPU, a sizeable part
of a small model's step); recording a loss here costs two list appends. A loss on the CPU is recorded as its value
(reading it there is no device sync): keeping its 0-dim tensor would pin one small heap block per step among the
step's freed activations, so the allocator's heap could not coalesce and kept growing (fresh page faults every few
steps on a transformer); a loss on another device stays a tensor, read only where the sum is.
"""

from __future__ import annotations

import torch

#: losses kept as separate tensors before they are stacked into one (bounds the number of objects)
_CHUNK = 1024


class NonFiniteLossFilter:
    """Replays the micro-batch losses added since the running sum was last read, replacing each non-finite one by
    the mean so far (mirrors HF ``Trainer``: ``tr_loss / (1 + global_step - last_logged_step)``).

    Memory: 4 bytes per micro-batch since the last read (stacked per 1,024), on the loss's device, plus one int.
    """

    def __init__(self) -> None:
        self._base: torch.Tensor | None = None  # the sum at the start of the interval (None: zero)
        self._chunks: list[torch.Tensor] = []
        self._pending: list[torch.Tensor | float] = []  # a CPU loss as its value (see the module docstring)
        self._steps: list[int] = []  # optimizer steps since the last log when each loss was added
        self._dtype = torch.float32  # of the losses recorded (their values are exact in a Python float)

    def reset(self, base_sum: torch.Tensor | None = None, base_steps: int = 0) -> None:
        """Start a new interval from ``base_sum`` (a 0-dim tensor, copied; None: zero). ``base_steps`` is kept for
        callers that restore a sum mid-interval (the steps each loss saw are recorded with it)."""
        self._base = None if base_sum is None else base_sum.detach().clone()
        self._chunks, self._pending, self._steps = [], [], []

    def add(self, loss: torch.Tensor, steps_since_log: int) -> None:
        """Record one micro-batch's (detached, 0-dim) loss and the optimizer steps taken since the last log; no
        device work except one stack per 1,024 losses (a CPU loss is kept as its value)."""
        pending = self._pending
        pending.append(loss.item() if loss.is_cpu else loss)
        self._steps.append(steps_since_log)
        self._dtype = loss.dtype
        if len(pending) >= _CHUNK:
            self._chunks.append(torch.stack([self._tensor(x) for x in pending]))
            self._pending = []

    def _tensor(self, x: torch.Tensor | float) -> torch.Tensor:
        """A recorded loss as a 0-dim tensor of its dtype (a recorded CPU value converts back exactly)."""
        return x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=self._dtype)

    def apply(self, running_sum: torch.Tensor, steps: int) -> torch.Tensor:
        """Filter ``running_sum`` (the unfiltered sum since the last reset) in place and return it; the next
        interval starts from the filtered value. Syncs with the device once when losses were recorded (only call
        it where the sum is read on the host anyway)."""
        if not self._pending and not self._chunks:
            return running_sum
        if not bool(torch.isfinite(running_sum)):  # some loss was non-finite: replay them with the filter
            base = self._base
            total = torch.zeros_like(running_sum) if base is None else base.to(running_sum.device).clone()
            losses = [x for chunk in self._chunks for x in chunk.unbind()] + [self._tensor(x) for x in self._pending]
            for x, k in zip(losses, self._steps):
                total += torch.where(torch.isfinite(x), x, total / (1 + k))
            running_sum.copy_(total)
        self.reset(running_sum, steps)
        return running_sum
