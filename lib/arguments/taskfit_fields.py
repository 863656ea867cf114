"""The taskfit-only option fields of `FitArguments`: device placement (Lightning's ``accelerator``, ``strategy``,
``devices``, ``num_nodes``, ``precision``, plus ``checkpoint_io``), checkpointing on interruption, and
Lightning's debugging switches (``fast_dev_run``, ``limit_*_batches``, ``overfit_batches``, ...). None of these
exists in ``transformers.TrainingArguments``; the HF guide's "Argument differences" table lists them.

Lightning types several switches as a union of two non-string types (``fast_dev_run: bool | int``,
``limit_train_batches: int | float``), which ``transformers.HfArgumentParser`` cannot turn into one command-line
type. Those fields are annotated with :class:`FlagOrCount` and :class:`CountOrFraction`: each is the one type
the parser calls on the option's text (``"5"`` -> ``5``, ``"0.25"`` -> ``0.25``, ``"true"`` -> ``True``) and
records the Python types the option accepts (``kinds``), so ``HfArgumentParser(TrainingArguments)`` parses them
as the ``taskfit`` command line does.
"""

from dataclasses import dataclass
from typing import Any

from taskfit.arguments.fields import _opt


class _OptionText:
    """Base of the converter types: ``Type(text)`` returns the option's value (not an instance of the class);
    ``kinds`` are the Python types the option accepts (read by ``FitArguments.field_kinds``).

    Raises:
        ValueError: text that is none of ``kinds`` (``argparse`` reports it as an invalid value).
    """

    kinds: tuple[type, ...] = ()

    def __new__(cls, text: Any) -> Any:  # type: ignore[misc]
        from taskfit.arguments.validation import _coerce

        if not isinstance(text, str):
            return _coerce(cls.__name__, text, cls.kinds)
        return _coerce(cls.__name__, text, cls.kinds + (type(None),) if text.strip().lower() in (
            "none", "null") else cls.kinds)


class FlagOrCount(_OptionText):
    """``True``/``False`` or a number of batches (Lightning's ``fast_dev_run: bool | int``): from text, ``"true"``
    -> ``True``, ``"5"`` -> ``5``."""

    kinds = (bool, int)


class CountOrFraction(_OptionText):
    """A number of batches (``int``) or a fraction of them (``float``), as Lightning's ``limit_*_batches``: from
    text, ``"10"`` -> ``10`` (ten batches), ``"0.25"`` -> ``0.25``, ``"1.0"`` -> ``1.0`` (all of them)."""

    kinds = (int, float)


@dataclass(repr=False)
class TaskfitFields:
    """Options taskfit adds to HF's (see the module docstring)."""

    # placement and interruption
    save_on_interrupt: bool | None = _opt(None, "On SIGTERM/Ctrl-C: finish the step, then checkpoint (True: on both; None: on SIGTERM and SLURM's SIGUSR1 only; False: never).", "checkpoint")
    accelerator: str = _opt("auto", "Device kind: auto | cpu | cuda | mps | xla.", "placement")
    strategy: str = _opt("auto", "Distribution strategy: auto | single_device | dp | ddp | fsdp | deepspeed | ...", "placement")
    devices: str = _opt("auto", "Devices: a count, a list of indices, 'auto' or -1 (all).", "placement")
    num_nodes: int = _opt(1, "Number of nodes (machines).", "placement")
    precision: str | None = _opt(None, "32-true | 64-true | 16-mixed | bf16-mixed | 16-true | bf16-true; None = from fp16/bf16.", "precision")
    checkpoint_io: str = _opt("auto", "Checkpoint storage plugin name (auto = fsspec with atomic writes).", "placement")
    # taskfit: Lightning's debugging switches (taskfit.debugging).
    fast_dev_run: FlagOrCount = _opt(False, "Debug pass: True or N runs N batches (1 for True) of training and validation, one epoch, no checkpoints or loggers.", "training", nargs="?", const=True)
    limit_train_batches: CountOrFraction | None = _opt(None, "Training batches per epoch: a count (int), or a fraction of the epoch (float); None = all.", "training")
    limit_val_batches: CountOrFraction | None = _opt(None, "Validation batches per evaluation: a count or a fraction; 0 = no validation; None = all.", "training")
    limit_test_batches: CountOrFraction | None = _opt(None, "Test batches: a count or a fraction; None = all.", "training")
    limit_predict_batches: CountOrFraction | None = _opt(None, "Prediction batches: a count or a fraction; None = all.", "training")
    overfit_batches: CountOrFraction = _opt(0, "Train and validate on the same first N (or fraction of) training batches, unshuffled; 0 = off.", "training")
    num_sanity_val_steps: int = _opt(0, "Validation batches run before training as a check, not logged; -1 = all.", "training")
    detect_anomaly: bool = _opt(False, "Run training under torch.autograd.detect_anomaly (slow; names the op making NaN).", "training")
    profiler: str | None = _opt(None, "Profile the run: simple (time per action) | advanced (cProfile per action) | pytorch (torch.profiler Chrome trace under output_dir); None = off.", "logging")
    gradient_clip_algorithm: str = _opt("norm", "How max_grad_norm clips: norm (global L2 norm) | value (each element to [-v, v]).", "training")


TASKFIT_FIELDS = tuple(TaskfitFields.__dataclass_fields__)
