"""Loop state and control flags: plain objects saved and restored whole (DESIGN.md, F-LOOP-6).

``FitState`` mirrors HF ``TrainerState`` (its field names, so HF-style callbacks work unchanged) and adds the
position inside the epoch that exact mid-epoch resume needs. ``FitControl`` mirrors HF ``TrainerControl``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FitState:
    """Everything that decides what the loop does next.

    Attributes:
        epoch (float): epochs done, fractional inside an epoch (HF semantics: micro-batches seen / per epoch).
        current_epoch (int): zero-based index of the running epoch (Lightning semantics).
        global_step (int): optimizer steps taken (one per accumulation window).
        max_steps (int): total optimizer steps of the run.
        num_train_epochs (int): epochs the run is planned for.
        batch_in_epoch (int): micro-batches consumed in the running epoch (the resume position).
        batches_per_epoch (int | None): micro-batches per epoch (None for data without a length); a resume
            checks it did not change.
        samples_seen (int): training samples consumed, all epochs.
        logging_steps / eval_steps / save_steps (int): resolved trigger intervals (steps).
        total_flos (float): floating point operations of the training so far (estimate).
        log_history (list[dict]): every dict passed to the loggers, with ``step``.
        best_metric (float | None), best_model_checkpoint (str | None), best_global_step (int | None).
        num_input_tokens_seen (int): tokens consumed (when counted).
        is_local_process_zero / is_world_process_zero (bool).
        stateful_callbacks (dict): callback states keyed by callback name.
    """

    epoch: float = 0.0
    current_epoch: int = 0
    global_step: int = 0
    max_steps: int = 0
    num_train_epochs: int = 0
    batch_in_epoch: int = 0
    batches_per_epoch: int | None = None
    samples_seen: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    total_flos: float = 0.0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_model_checkpoint: str | None = None
    best_global_step: int | None = None
    num_input_tokens_seen: int = 0
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    stateful_callbacks: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        """A deep-copyable dict of every field."""
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore fields from :meth:`state_dict` output (unknown keys are ignored for forward compatibility)."""
        names = {f.name for f in dataclasses.fields(self)}
        for k, v in state.items():
            if k in names:
                setattr(self, k, v)


@dataclass
class FitControl:
    """Flags callbacks set to steer the loop (mirrors HF ``TrainerControl``). The loop resets the per-step
    flags after acting on them."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = self.should_evaluate = self.should_log = False

    def state_dict(self) -> dict[str, bool]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, bool]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
