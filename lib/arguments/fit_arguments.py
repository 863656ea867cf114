"""`FitArguments`: the one dataclass of training options (F-CORE-4).

Every option of Hugging Face ``transformers.TrainingArguments`` and ``Seq2SeqTrainingArguments`` 5.x is a field
here under the same name, type and default (:mod:`taskfit.arguments.fields`), so is every 4.x spelling that
transformers 5 removed (:mod:`taskfit.arguments.legacy`: accepted with a ``FutureWarning`` naming the new
option), plus the taskfit placement and debugging options (:mod:`taskfit.arguments.taskfit_fields`). The process
properties HF scripts read (``world_size``, ``should_save``, ``get_process_log_level()``, ...) come from
:mod:`taskfit.arguments.runtime`. ``Fit(...)`` keyword arguments, YAML/JSON configs and the ``taskfit`` CLI are
views of this class.

Options taskfit will never support raise ``ValueError`` at construction.
"""

import copy
import functools
import json
import math
import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from taskfit.arguments.setters import (  # noqa: F401 - the option tables are re-exported
    BUILT_LOGGERS, DDP_BACKENDS, DEBUG_OPTIONS, FSDP_OPTIONS, HALF_PRECISION_BACKENDS, HUB_STRATEGIES,
    INTERVAL_STRATEGIES, LOG_LEVELS, LR_SCHEDULERS, OPTIMIZERS, PRECISIONS, REPORT_TO, SAVE_STRATEGIES,
    ArgumentSetters, field_kinds,
)
from taskfit.arguments.fields import HFTrainingFields, Seq2SeqFields
from taskfit.arguments.legacy import LegacyFields
from taskfit.redact import SECRET_FIELDS, redact_value  # noqa: F401 - re-exported
from taskfit.arguments.runtime import ParallelMode, RuntimeProperties  # noqa: F401 - re-exported
from taskfit.arguments.taskfit_fields import TaskfitFields
from taskfit.registry import invalid_choice, unknown_option



@dataclass(repr=False)
class FitArguments(ArgumentSetters, RuntimeProperties, TaskfitFields, LegacyFields, Seq2SeqFields, HFTrainingFields):
    """Every training option in one validated dataclass; mirrors ``transformers.TrainingArguments`` 5.x (and
    ``Seq2SeqTrainingArguments``: the generation options are fields of every ``FitArguments``).

    Field names, types and defaults are those of HF (see each field's ``metadata["help"]``), so an HF config and
    an ``HfArgumentParser`` command line carry over unchanged. The differences are listed in the HF guide's
    "Argument differences" table: ``report_to=None`` writes a local CSV log (HF 5: no logger), ``output_dir=None``
    becomes ``"trainer_output"`` (as HF), and options that cannot work in taskfit
    (``use_liger_kernel``, ``parallelism_config``, ``eval_use_gather_object``, ``hub_revision`` with
    ``push_to_hub``, apex/IPEX/jit options) raise ``ValueError`` at construction when set.

    Construction normalises and validates (``__post_init__``): every error is a ``ValueError`` naming the bad
    value and the valid choices, raised before any work. transformers 4.x spellings (``evaluation_strategy``,
    ``per_gpu_*_batch_size``, ``no_cuda``, ``warmup_ratio``, ``group_by_length``, ``include_inputs_for_metrics``,
    ``adafactor``, ``fp16_backend``, ``torchdynamo``, ...) emit a ``FutureWarning`` naming the HF 5 option and
    are copied into it. ``report_to`` becomes a list (``"none"`` -> ``[]``; ``"all"`` -> every installed logger;
    ``None`` -> ``["csv"]``); ``fsdp`` and ``debug`` become lists of options; JSON strings given for dict options
    are decoded.

    Raises:
        ValueError: a bad value, a conflict between options, or an option taskfit never supports.
    """

    def __post_init__(self) -> None:
        self._normalize_and_validate()

    # ----------------------------------------------------------------------------------------------------------
    # Derived values
    def validate(self) -> "FitArguments":
        """Re-run normalisation and validation after direct attribute assignment; returns ``self``.

        Raises:
            ValueError: as for construction.
        """
        self.__post_init__()
        return self

    def resolved_precision(self) -> str:
        """The precision plugin name: ``"bf16-mixed"`` if ``bf16``, ``"16-mixed"`` if ``fp16``, else ``precision``,
        else ``"32-true"`` (mirrors how HF maps its ``fp16``/``bf16`` flags onto AMP)."""
        if self.bf16:
            return "bf16-mixed"
        if self.fp16:
            return "16-mixed"
        return self.precision or "32-true"

    @property
    def resolved_logging_dir(self) -> str:
        """``logging_dir``, else ``<output_dir>/logs``. Loggers write local files, so for a remote ``output_dir``
        (an fsspec URL such as ``s3://bucket/run``) the default is the local folder ``runs/<bucket>_<run>/logs``;
        a ``file://`` URL becomes its path."""
        return self.logging_dir or default_logging_dir(self.output_dir)

    @property
    def resolved_run_name(self) -> str:
        """``run_name`` or, as in HF, ``output_dir`` when it is None."""
        return self.run_name or self.output_dir

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup length in optimizer steps: ``int(warmup_steps)`` if >= 1, ``ceil(num_training_steps *
        warmup_steps)`` if in (0, 1), else ``ceil(num_training_steps * warmup_ratio)`` (mirrors HF 5
        ``TrainingArguments.get_warmup_steps``; ``warmup_ratio`` is the 4.x spelling)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(num_training_steps * ratio)

    def interval_steps(self, kind: str, num_training_steps: int) -> int:
        """Absolute step interval for ``kind`` in ``logging|eval|save``: the ``*_steps`` value, or for a ratio
        (float < 1) ``ceil(num_training_steps * ratio)``, as HF's Trainer resolves it.

        Raises:
            ValueError: unknown ``kind``.
        """
        if kind not in ("logging", "eval", "save"):
            raise invalid_choice("interval kind", kind, ("logging", "eval", "save"))
        value = getattr(self, f"{kind}_steps")
        if value is None:
            value = self.logging_steps
        return max(1, math.ceil(num_training_steps * value)) if value < 1 else int(value)

    # ----------------------------------------------------------------------------------------------------------
    # Construction helpers
    @classmethod
    def field_names(cls) -> list[str]:
        """All option names, in declaration order (HF signature order, then seq2seq, then taskfit)."""
        return [f.name for f in fields(cls)]

    @classmethod
    def field_kinds(cls, name: str) -> tuple[type, ...]:
        """Plain types option ``name`` accepts, e.g. ``(int, NoneType)`` (used by the CLI).

        Raises:
            ValueError: unknown option (with "Did you mean").
        """
        return field_kinds(cls, name)

    @classmethod
    def _check_keys(cls, keys: Any) -> None:
        names = set(cls.field_names())
        for key in keys:
            if key not in names:
                raise unknown_option("FitArguments option", key, names, "help(FitArguments) or `taskfit fit --help`",
                                     _OTHER_NAMES)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FitArguments":
        """Build from a mapping of option names.

        Raises:
            ValueError: an unknown key (with "Did you mean"), or any validation error.
            TypeError: ``d`` is not a dict.
        """
        if not isinstance(d, dict):
            raise TypeError(f"FitArguments expects a mapping of options, got {type(d).__name__}.")
        cls._check_keys(d)
        return cls(**d)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "FitArguments":
        """Like :meth:`from_dict`, from keyword arguments."""
        return cls.from_dict(kwargs)

    def replace(self, **changes: Any) -> "FitArguments":
        """A validated copy with ``changes`` applied (``self`` is unchanged).

        Raises:
            ValueError: an unknown option name (with "Did you mean") or any validation error.
        """
        self._check_keys(changes)
        base = self.to_dict()
        for old, (new, default) in _MIRRORED.items():  # a 4.x name given alone takes effect, as at construction
            if old in changes and new not in changes:
                base[new] = copy.deepcopy(default)
        return type(self)(**{**base, **copy.deepcopy(changes)})

    def _apply(self, **changes: Any) -> "FitArguments":
        """Apply ``changes`` in place atomically: validate a copy first, then copy its values into ``self``."""
        candidate = self.replace(**changes)
        for f in fields(self):
            setattr(self, f.name, getattr(candidate, f.name))
        return self

    # ----------------------------------------------------------------------------------------------------------
    # Serialisation
    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        """All options as a plain dict (deep copy). ``redact=True`` replaces set tokens by ``"<HUB_TOKEN>"``-style
        placeholders, as HF's ``to_dict`` does; the default keeps them so that round trips are exact."""
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        # a torch.dtype field (a user subclass's, as HF allows) as its name: "float32" (HF's to_dict)
        d = {k: str(v).removeprefix("torch.") if type(v).__name__ == "dtype" and type(v).__module__ == "torch" else v
             for k, v in d.items()}
        if redact:
            d = {k: _redacted(k, v) for k, v in d.items()}
        return d

    def to_json_string(self, redact: bool = True, indent: int = 2) -> str:
        """JSON text of :meth:`to_dict` (``FitArguments.from_json(a.to_json_string()) == a`` when no credential is
        set). Credentials are redacted unless ``redact=False`` (see :func:`redact_value`)."""
        return json.dumps(self.to_dict(redact=redact), indent=indent)

    def to_yaml(self, redact: bool = True) -> str:
        """YAML text of :meth:`to_dict`, in field order (``FitArguments.from_yaml(a.to_yaml()) == a`` when no
        credential is set). Credentials are redacted unless ``redact=False``."""
        import yaml

        return yaml.safe_dump(self.to_dict(redact=redact), sort_keys=False, default_flow_style=False)

    def to_sanitized_dict(self) -> dict[str, bool | int | float | str]:
        """Scalars only, for logger hyperparameter tables: other values become ``str(value)``, tokens are
        redacted, and ``train_batch_size``/``eval_batch_size`` are added (mirrors
        ``TrainingArguments.to_sanitized_dict``)."""
        d = {**self.to_dict(redact=True), "train_batch_size": self.train_batch_size,
             "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}

    @classmethod
    def from_yaml(cls, path_or_text: str | os.PathLike) -> "FitArguments":
        """Load from a YAML file path or YAML text (safe loader).

        Raises:
            FileNotFoundError: a path ending in .yaml/.yml that does not exist.
            ValueError: not a mapping, an unknown key (with "Did you mean"), or a validation error.
        """
        return cls.from_dict(read_config(path_or_text, "yaml"))

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> "FitArguments":
        """Load from a JSON file path or JSON text (errors as :meth:`from_yaml`)."""
        return cls.from_dict(read_config(path_or_text, "json"))

    def save(self, path: str | os.PathLike, redact: bool = True) -> Path:
        """Write to ``path`` as YAML (``.yaml``/``.yml``) or JSON (``.json``); returns the path. Credentials (tokens,
        passwords and keys in option values, URL passwords) are written as placeholders unless ``redact=False``.

        Raises:
            ValueError: another extension.
        """
        path = Path(path)
        fmt = _format_of(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(redact) if fmt == "yaml" else self.to_json_string(redact) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "FitArguments":
        """Read a file written by :meth:`save` (format by extension; errors as :meth:`from_yaml`)."""
        path = Path(path)
        return cls.from_dict(read_config(path, _format_of(path)))

    def __repr__(self) -> str:
        defaults = _default_values()
        changed = [f"{f.name}={_redacted(f.name, getattr(self, f.name))!r}" for f in fields(self)
                   if getattr(self, f.name) != defaults.get(f.name)]
        return f"{type(self).__name__}({', '.join(changed)})"


def default_logging_dir(output_dir: str) -> str:
    """``<output_dir>/logs``, a local folder: for an fsspec URL ``s3://bucket/run`` it is ``runs/bucket_run/logs``
    (loggers write local files); a ``file://`` URL becomes its path. Mirrors HF's default ``logging_dir`` under
    ``output_dir``."""
    out = output_dir.rstrip("/")
    if out.startswith("file://"):
        out = out[len("file://"):]
    elif "://" in out:
        out = os.path.join("runs", out.split("://", 1)[1].strip("/").replace("/", "_"))
    return out + "/logs"


def _redacted(name: str, value: Any) -> Any:
    return redact_value(name, value)


@lru_cache(maxsize=1)
def _default_values_cached() -> tuple[tuple[str, Any], ...]:
    return tuple(FitArguments().to_dict().items())


def _default_values() -> dict[str, Any]:
    """Normalised default value of every option (what ``FitArguments()`` holds)."""
    return dict(_default_values_cached())


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    raise invalid_choice("config file extension", suffix or str(path), (".yaml", ".yml", ".json"))


def read_config(path_or_text: str | os.PathLike, fmt: str | None = None) -> dict[str, Any]:
    """Read a YAML/JSON mapping from a file path or from text (the CLI uses this for its ``--config``).

    Args:
        path_or_text: a ``Path``, a path string (an existing file, or a name ending in .yaml/.yml/.json), or the
            text itself.
        fmt: ``"yaml"`` or ``"json"``; None = from the file extension (text defaults to YAML, a JSON superset).

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: the content is not a mapping (or unparsable).
    """
    text, where = path_or_text, "text"
    is_path = isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text
        and (os.path.isfile(path_or_text) or path_or_text.lower().endswith((".yaml", ".yml", ".json"))))
    if isinstance(path_or_text, (str, os.PathLike)) and "\n" not in str(path_or_text) and os.path.isdir(path_or_text):
        raise IsADirectoryError(f"Config {str(path_or_text)!r} is a directory; give the path of a YAML or JSON file.")
    if is_path:
        path = Path(path_or_text)
        if not path.is_file():
            raise FileNotFoundError(f"Config file {str(path)!r} does not exist.")
        text, where = path.read_text(encoding="utf-8"), str(path)
        fmt = fmt or _format_of(path)
    import yaml

    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ValueError(f"Cannot parse {fmt or 'yaml'} config ({where}): {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"A config ({where}) must be a mapping of option names, got {type(data).__name__}.")
    return data


#: 4.x name -> (the HF 5 option it mirrors, that option's default); see ``taskfit.arguments.legacy._mirror``
_MIRRORED = {"gradient_checkpointing": ("activation_checkpointing", None),
             "gradient_checkpointing_kwargs": ("activation_checkpointing_kwargs", None),
             "group_by_length": ("train_sampling_strategy", "random"),
             "include_inputs_for_metrics": ("include_for_metrics", [])}

#: names users bring from Lightning / plain PyTorch habits -> the FitArguments option
_OTHER_NAMES = {"lr": "learning_rate", "epochs": "num_train_epochs", "max_epochs": "num_train_epochs",
                "num_epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
                "accumulate_grad_batches": "gradient_accumulation_steps", "gradient_clip_val": "max_grad_norm",
                "log_every_n_steps": "logging_steps", "default_root_dir": "output_dir", "weight_decay_rate": "weight_decay"}


def _init_with_suggestions(init: Any) -> Any:
    """Wrap the dataclass ``__init__`` so an unknown keyword names the closest options (not a bare TypeError)."""

    @functools.wraps(init)
    def __init__(self: FitArguments, *args: Any, **kwargs: Any) -> None:
        type(self)._check_keys(kwargs)
        init(self, *args, **kwargs)

    return __init__


FitArguments.__init__ = _init_with_suggestions(FitArguments.__init__)  # type: ignore[method-assign]

__all__ = ["BUILT_LOGGERS", "FitArguments", "read_config"]
