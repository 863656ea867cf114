"""TensorBoard logger (``report_to="tensorboard"``, extra ``tensorboard``), over ``torch.utils.tensorboard``."""

from __future__ import annotations

from typing import Any

from taskfit.loggers.logger import Logger, entries_at, flat_params, require, scalar_metrics

_GROUPS = (("eval_", "eval/"), ("test_", "test/"), ("predict_", "predict/"), ("val_", "val/"),
           ("validation_", "validation/"), ("valid_", "valid/"))


def tensorboard_tag(name: str) -> str:
    """The TensorBoard tag of a logged name, grouped as HF's ``TensorBoardCallback`` does: ``eval_loss`` ->
    ``eval/loss``, ``test_acc`` -> ``test/acc``, Lightning's stage names by their own group (``val_loss`` ->
    ``val/loss``, ``validation_acc`` -> ``validation/acc``), anything else -> ``train/<name>`` (``loss`` ->
    ``train/loss``, a user's ``train_loss`` -> ``train/train_loss``); names that already hold a ``/`` (e.g.
    ``device/...``, ``summary/...``) are kept."""
    if "/" in name:
        return name
    for prefix, group in _GROUPS:
        if name.startswith(prefix):
            return group + name[len(prefix):]
    return "train/" + name


class TensorBoardLogger(Logger):
    """Write TensorBoard event files: one scalar per metric at its ``global_step`` under a grouped tag (see
    :func:`tensorboard_tag`), the end-of-run summary under ``summary/...``, and the hyperparameters (HParams
    plugin plus a text summary). Mirrors Lightning's ``TensorBoardLogger`` and HF's ``TensorBoardCallback``
    (``logging_dir`` is the event folder).

    On resume from a checkpoint at step ``T`` the writer starts with ``purge_step=T``, so TensorBoard drops the
    points the stopped run wrote at ``T`` and after, and the points the checkpoint had seen at ``T`` are written
    again from its history: every step holds one point.

    Args:
        save_dir (str): folder of the event files (created on the first write).
        flush_secs (int): seconds between flushes of the writer (``SummaryWriter(flush_secs=...)``).

    Raises:
        ModuleNotFoundError: ``tensorboard`` is not installed (extra ``tensorboard``); raised at construction.
    """

    name = "tensorboard"

    def __init__(self, save_dir: str, flush_secs: int = 30) -> None:
        require("tensorboard", "tensorboard", "TensorBoardLogger (report_to='tensorboard')")
        self.save_dir, self.flush_secs = save_dir, flush_secs
        self._writer: Any = None
        self._purge_step: int | None = None
        self._replay: list[dict[str, Any]] = []

    @property
    def experiment(self) -> Any:
        """The ``torch.utils.tensorboard.SummaryWriter`` (created on first use, so only rank zero makes files)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.save_dir, flush_secs=self.flush_secs,
                                         purge_step=self._purge_step)
            replay, self._replay = self._replay, []
            for logs in replay:
                self.log_metrics(logs, self._purge_step or 0)
        return self._writer

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        if step > 0 and self._writer is None:
            self._purge_step, self._replay = step, entries_at(log_history, step)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        if self._purge_step:  # a resumed run: the stopped run wrote them already (at step 0, kept by the purge)
            self.experiment  # noqa: B018  opens the writer (purge and replay) now
            return

        clean = flat_params(params)
        writer = self.experiment
        for summary in hparams(clean, {}):
            writer.file_writer.add_summary(summary)
        writer.add_text("hparams", "\n".join(f"    {k}: {v}" for k, v in sorted(clean.items())))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        writer = self.experiment
        for k, v in scalar_metrics(metrics).items():
            writer.add_scalar(tensorboard_tag(k), v, global_step=step)

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
