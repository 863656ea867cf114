"""Small typed views of ``Fit`` and of one run, for the helpers and callbacks below ``taskfit.fit`` (layer 1:
imports nothing from taskfit). A helper's signature says what it reads: ``def on_fit_start(self, fit: FitView,
module)`` instead of importing ``Fit`` (which would point an import up the layers). ``taskfit.Fit`` and
``taskfit.fit.run.Run`` satisfy them structurally; nothing subclasses them. Mirrors torchtitan's ``protocols/``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RunView(Protocol):
    """What helpers read of the objects one ``fit``/``validate``/``test``/``predict`` call works on
    (:class:`taskfit.fit.run.Run`).

    Attributes:
        stage (str): ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        model (nn.Module): the user's model; module (TaskModule): what the loops drive.
        state (FitState), control (FitControl): the loop state and flags.
        plan (RunPlan): the run's plan (step budget, intervals, batch layout), never restored; a re-plan assigns a
            new one.
        optimizers (list[Optimizer]): as the strategy returned them; schedulers (list[SchedulerConfig]).
        train_loader (Any), eval_loaders (dict[str | None, Any]): the run's loaders.
        sums (LossSums): the fit loop's running loss sums.
        training_state (TrainingState | None): the state a checkpoint saves and restores whole (``fit`` only).
        resume_from (str | None), start_step (int): the checkpoint this run continues and ``global_step`` at its
            start (set by :func:`taskfit.checkpoint.resume.restore`).
    """

    stage: str
    model: Any
    module: Any
    state: Any
    control: Any
    plan: Any
    optimizers: list[Any]
    schedulers: list[Any]
    train_loader: Any
    eval_loaders: dict[Any, Any]
    sums: Any
    training_state: Any
    resume_from: str | None
    start_step: int

    @property
    def optimizer(self) -> Any:
        """The first optimizer, None before one was configured."""


@runtime_checkable
class FitView(Protocol):
    """What callbacks and helpers read of a ``Fit`` (mirrors the members of Lightning's ``Trainer`` and HF's
    ``Trainer`` that callbacks use).

    Attributes:
        args (FitArguments): the options; strategy (Strategy): the resolved strategy (accelerator, precision,
            checkpoint IO through it); callbacks (list[Callback]); loggers (list[Logger]).
        callback_metrics (dict[str, Any]), logged_metrics (dict[str, Any]): Lightning's metric dicts.
        num_eval_batches (int | None): batches of the running evaluation, when known.
        sanity_checking (bool): True while ``num_sanity_val_steps`` runs.
        processing_class (Any | None): the tokenizer / processor saved next to the model (HF
            ``Trainer.processing_class``).
        loop_policy (LoopPolicy): where the loops follow Lightning's semantics or HF's (``taskfit.loops.policy``).
    """

    args: Any
    strategy: Any
    callbacks: list[Any]
    loggers: list[Any]
    callback_metrics: dict[str, Any]
    logged_metrics: dict[str, Any]
    num_eval_batches: int | None
    sanity_checking: bool
    processing_class: Any
    loop_policy: Any

    @property
    def run(self) -> RunView | None:
        """The run of the call in progress; None outside ``fit``/``validate``/``test``/``predict``."""

    @property
    def state(self) -> Any:
        """The loop state (HF ``TrainerState`` fields) of the current or last run."""

    @property
    def control(self) -> Any:
        """The control flags (HF ``TrainerControl``) of the current or last run."""

    @property
    def model(self) -> Any:
        """The user's model of the current or last run."""

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers of the current or last run (as the strategy returned them)."""

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The LR scheduler configs (``.scheduler``) of the current or last run."""

    @property
    def local_rank(self) -> int:
        """Index of this process on its machine (0-based)."""

    @property
    def is_global_zero(self) -> bool:
        """True on the process with global rank 0."""

    @property
    def world_size(self) -> int:
        """Number of processes taking part."""

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """Send a row of metrics to the loggers and ``on_log`` callbacks (HF ``Trainer.log``)."""

    def save_checkpoint(self, filepath: str | None = None) -> str:
        """Write a checkpoint of the current training run; returns its folder (Lightning
        ``Trainer.save_checkpoint``)."""
