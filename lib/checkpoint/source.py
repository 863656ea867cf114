"""What the checkpoint package reads of a running fit: a small ``typing.Protocol`` (``Fit`` satisfies it; nothing
here imports ``Fit``)."""

from __future__ import annotations

from typing import Any, Protocol


class CheckpointSource(Protocol):
    """The run a checkpoint is written from (or the best model loaded into, or the final model published from).

    Attributes:
        args: the run's ``FitArguments`` (``output_dir``, ``save_*``, ``push_to_hub``...).
        state: its ``FitState`` (``global_step``, ``best_model_checkpoint``, ``hf_dict()``...).
        control: its ``FitControl`` (HF ``TrainerControl``).
        callbacks: the callbacks (their HF ``stateful_callbacks`` states).
        strategy: the run's ``Strategy`` (ranks, checkpoint IO, save/load).
        model: the unwrapped model of the run.
        optimizers: the run's optimizers (as the strategy returned them).
        lr_scheduler_configs: the run's LR scheduler configs (``.scheduler``).
        processing_class: the tokenizer / processor saved next to the model, or None.
    """

    args: Any
    state: Any
    control: Any
    callbacks: list[Any]
    strategy: Any
    processing_class: Any

    @property
    def model(self) -> Any: ...

    @property
    def optimizers(self) -> list[Any]: ...

    @property
    def lr_scheduler_configs(self) -> list[Any]: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...


class ResumableRun(Protocol):
    """The run a resume restores into (:func:`taskfit.checkpoint.resume.restore`), already set up by the strategy.

    Attributes:
        model: the model (as set up); optimizers: its optimizers; schedulers: its LR scheduler configs
        (``.scheduler``); train_loader: this process's training loader; training_state: the run's
        ``TrainingState`` (loaded whole); state: its ``FitState``; resume_from, start_step: set by the resume.
    """

    model: Any
    optimizers: list[Any]
    schedulers: list[Any]
    train_loader: Any
    training_state: Any
    state: Any
    resume_from: str | None
    start_step: int
