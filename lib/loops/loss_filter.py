"""HF's ``logging_nan_inf_filter`` applied lazily: the fit loop adds every micro-batch's loss to its running sum
unfiltered (one device op per micro-batch, in HF's summation order), and the filter is applied only where the sum
is read, which is a host sync anyway (a logging step, a checkpoint, the end of training). There a single
finiteness check of the sum decides: all losses were finite (the sum is, the usual case) and the sum is exact as it
is; otherwise the micro-batches since the sum was last read are replayed with the filter, giving the same float32
values as filtering each one eagerly as HF does.

Filtering eagerly costs ``isfinite`` + a division + ``where`` per micro-batch (about 10 µs on a CPU, a sizeable part
of a small model's step); recording a loss here costs a list append and one copy. A loss on the CPU is copied into
a buffer allocated once per 1,024 losses: keeping its 0-dim tensor would pin one small heap block per step among
the step's freed activations, so the allocator's heap could not coalesce and kept growing (fresh page faults every
few steps on a transformer); a loss on another device stays a tensor, read only where the sum is.
"""

from __future__ import annotations

import torch

#: losses kept as separate tensors before they are stacked into one (bounds the number of objects)
_CHUNK = 1024


class NonFiniteLossFilter:
    """Replays the micro-batch losses added since the running sum was last read, replacing each non-finite one by
    the mean so far (mirrors HF ``Trainer``: ``tr_loss / (1 + global_step - last_logged_step)``).

    Memory: one element per micro-batch since the last read, on the loss's device (CPU losses are copied into a
    buffer of 1,024 allocated once per 1,024 losses; others are stacked per 1,024), plus one int.
    """

    def __init__(self) -> None:
        self._base: torch.Tensor | None = None  # the sum at the start of the interval (None: zero)
        self.reset()

    def reset(self, base_sum: torch.Tensor | None = None, base_steps: int = 0) -> None:
        """Start a new interval from ``base_sum`` (a 0-dim tensor, copied; None: zero). ``base_steps`` is kept for
        callers that restore a sum mid-interval (the steps each loss saw are recorded with it)."""
        self._base = None if base_sum is None else base_sum.detach().clone()
        self._chunks: list[torch.Tensor] = []
        self._pending: list[torch.Tensor] = []  # losses on another device, stacked per _CHUNK
        self._buf: torch.Tensor | None = None  # CPU losses, copied in (see the module docstring)
        self._n = 0  # losses in _buf
        self._steps: list[int] = []  # optimizer steps since the last log when each loss was added

    def add(self, loss: torch.Tensor, steps_since_log: int) -> None:
        """Record one micro-batch's (detached, 0-dim) loss and the optimizer steps taken since the last log; no
        host sync (a CPU loss is copied into a preallocated buffer, another device's is kept as a tensor)."""
        self._steps.append(steps_since_log)
        if loss.is_cpu:
            buf = self._buf
            if buf is None or buf.dtype != loss.dtype or self._pending:
                self._flush()
                buf = self._buf = torch.empty(_CHUNK, dtype=loss.dtype)
            buf[self._n] = loss
            self._n += 1
            if self._n == _CHUNK:
                self._flush()
            return
        if self._n:
            self._flush()
        self._pending.append(loss)
        if len(self._pending) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Move the recorded losses into ``_chunks``, in the order they were added."""
        if self._pending:
            self._chunks.append(torch.stack(self._pending))
            self._pending = []
        if self._n:
            self._chunks.append(self._buf[: self._n])
        self._buf, self._n = None, 0

    def apply(self, running_sum: torch.Tensor, steps: int) -> torch.Tensor:
        """Filter ``running_sum`` (the unfiltered sum since the last reset) in place and return it; the next
        interval starts from the filtered value. Syncs with the device once when losses were recorded (only call
        it where the sum is read on the host anyway)."""
        if not self._steps:
            return running_sum
        if not bool(torch.isfinite(running_sum)):  # some loss was non-finite: replay them with the filter
            self._flush()
            base = self._base
            total = torch.zeros_like(running_sum) if base is None else base.to(running_sum.device).clone()
            losses = [x.to(running_sum.device) for chunk in self._chunks for x in chunk.unbind()]
            for x, k in zip(losses, self._steps):
                total += torch.where(torch.isfinite(x), x, total / (1 + k))
            running_sum.copy_(total)
        self.reset(running_sum, steps)
        return running_sum
