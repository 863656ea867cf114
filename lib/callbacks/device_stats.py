"""``DeviceStatsMonitor``: the accelerator's device statistics in the logs at every logging step (F-ACC-2, F-OBS-2;
mirrors Lightning's ``DeviceStatsMonitor``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taskfit.callbacks.base import Callback

if TYPE_CHECKING:
    from taskfit.protocols import FitView
    from taskfit.core.module import TaskModule


class DeviceStatsMonitor(Callback):
    """On each logging step, log ``accelerator.get_device_stats(device)`` of this process's device under
    ``device/<name>``: on CUDA allocated / reserved / peak-allocated memory in bytes and, with ``nvidia-ml-py``,
    utilisation in percent; on MPS allocated / driver / recommended-max bytes; on CPU the resident set size in
    bytes (``cpu_rss_bytes``). Reading the stats happens only on logging steps (no per-step host sync).

    Args:
        prefix (str): key prefix (default ``"device/"``).
    """

    def __init__(self, prefix: str = "device/") -> None:
        self.prefix = prefix
        self._fit: FitView | None = None

    def on_fit_start(self, fit: FitView, module: TaskModule) -> None:
        self._fit = fit

    def stats(self) -> dict[str, float]:
        """The current device statistics with the prefix (empty before ``fit`` started)."""
        if self._fit is None:
            return {}
        strategy = self._fit.strategy
        raw = strategy.accelerator.get_device_stats(strategy.root_device)
        return {f"{self.prefix}{k}": float(v) for k, v in raw.items()}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """HF hook, after the loop set this step's flags: on a logging step, log the stats."""
        if control.should_log and self._fit is not None:
            logs = self.stats()
            if logs:
                self._fit.log(logs)
