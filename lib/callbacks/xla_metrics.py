"""``debug="tpu_metrics_debug"`` (HF's ``tpu_metrics_debug``): print torch_xla's metrics report (compilations,
graph executions, device transfers) at the end of every training epoch, on rank 0 (F-ACC-1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_utilities.core.rank_zero import rank_zero_only

from taskfit.callbacks.base import Callback

if TYPE_CHECKING:
    from taskfit.protocols import FitView
    from taskfit.core.module import TaskModule


def check_xla_metrics_option(args: object, accelerator_name: str) -> bool:
    """Whether ``tpu_metrics_debug`` (or ``debug`` containing it) is on.

    Raises:
        ValueError: it is on while the accelerator is not XLA (there are no XLA metrics to report).
    """
    on = bool(getattr(args, "tpu_metrics_debug", False)) or "tpu_metrics_debug" in (getattr(args, "debug", None) or [])
    if on and accelerator_name != "xla":
        raise ValueError(f"debug='tpu_metrics_debug' reports torch_xla metrics, but the accelerator is "
                         f"{accelerator_name!r}; use accelerator='xla' (PJRT_DEVICE=TPU/CPU/CUDA) or drop the option.")
    return on


class XLAMetricsReport(Callback):
    """Print ``torch_xla.debug.metrics.metrics_report()`` after each training epoch (mirrors HF's
    ``tpu_metrics_debug``); the text is also kept in :attr:`reports`."""

    def __init__(self) -> None:
        self.reports: list[str] = []

    def on_train_epoch_end(self, fit: FitView, module: TaskModule) -> None:
        import torch_xla.debug.metrics as met

        self.reports.append(met.metrics_report())
        self._print(self.reports[-1])

    @staticmethod
    @rank_zero_only
    def _print(text: str) -> None:
        print(text)
