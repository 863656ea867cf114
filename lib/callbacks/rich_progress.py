"""A ``rich`` progress bar (mirrors Lightning's ``RichProgressBar``; extra ``taskfit[rich]``)."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.progress import ProgressBar


def _require_rich() -> Any:
    try:
        import rich.progress
    except ImportError as exc:  # pragma: no cover - the test extra installs rich
        raise ImportError("RichProgressBar needs the 'rich' package: pip install 'taskfit[rich]'.") from exc
    return rich.progress


class RichProgressBar(ProgressBar):
    """The progress bar of :class:`~taskfit.callbacks.progress.ProgressBar` (the same values: epoch, step, loss,
    learning rate, ``prog_bar=True`` values, evaluation values; :attr:`metrics`) drawn with ``rich``: one task
    for training (``Epoch N``), one per evaluation, the values as ``name: value`` after the bar. Only rank zero
    draws; giving it in ``callbacks`` replaces the default bar.

    Mirrors ``lightning.pytorch.callbacks.RichProgressBar`` (``refresh_rate``, ``leave``, ``console_kwargs``).

    Args:
        refresh_rate (int): redraws per second of the live display (>= 1).
        leave (bool): keep the finished bars on screen.
        console_kwargs (dict | None): passed to ``rich.console.Console`` (e.g. ``file``, ``width``).

    Raises:
        ImportError: ``rich`` is not installed (``pip install 'taskfit[rich]'``), raised at construction.
        ValueError: ``refresh_rate`` < 1.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, console_kwargs: dict[str, Any] | None = None
                 ) -> None:
        _require_rich()
        if not isinstance(refresh_rate, int) or refresh_rate < 1:
            raise ValueError(f"RichProgressBar refresh_rate={refresh_rate!r} must be an int >= 1.")
        super().__init__()
        self.refresh_rate, self.leave = refresh_rate, leave
        self._console_kwargs = dict(console_kwargs or {})
        self.progress: Any = None
        self.console: Any = None

    def metrics_text(self) -> str:
        """The values after the bar, as drawn: ``name: value`` separated by spaces."""
        return " ".join(f"{k}: {v}" for k, v in self._postfix.items())

    def _ensure_progress(self) -> Any:
        if self.progress is None:
            from rich.console import Console

            rp = _require_rich()
            self.console = Console(**self._console_kwargs)
            self.progress = rp.Progress(
                rp.TextColumn("[progress.description]{task.description}"), rp.BarColumn(),
                rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), rp.TextColumn("{task.fields[metrics]}"),
                console=self.console, refresh_per_second=self.refresh_rate, transient=not self.leave)
            self.progress.start()
        return self.progress

    def _stop_if_idle(self) -> None:
        if self.progress is not None and self.train_bar is None and self.eval_bar is None:
            self.progress.stop()
            self.progress = None

    def _open_train(self, total: int, initial: int) -> None:
        self.train_bar = self._ensure_progress().add_task(f"Epoch {self._epoch}", total=total, completed=initial,
                                                          metrics=self.metrics_text())

    def _describe_epoch(self) -> None:
        self.progress.update(self.train_bar, description=f"Epoch {self._epoch}")

    def _advance_train(self) -> None:
        self.progress.update(self.train_bar, advance=1, metrics=self.metrics_text())

    def _show(self) -> None:
        self.progress.update(self.train_bar, metrics=self.metrics_text())

    def _close_train(self) -> None:
        self._show()
        self.progress.refresh()
        self.train_bar = None
        self._stop_if_idle()

    def _write(self, line: str) -> None:
        self._ensure_progress().console.print(line, markup=False, highlight=False)
        self._stop_if_idle()

    def _open_eval(self, total: int, desc: str) -> None:
        self.eval_bar = self._ensure_progress().add_task(desc, total=total, metrics="")

    def _advance_eval(self) -> None:
        self.progress.update(self.eval_bar, advance=1)

    def _close_eval(self) -> None:
        self.progress.remove_task(self.eval_bar)
        self.eval_bar = None
        self._stop_if_idle()
