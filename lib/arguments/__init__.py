"""Every option of a run in one dataclass, ``FitArguments``: the Hugging Face ``TrainingArguments`` fields under
their HF names, taskfit's own fields, legacy spellings, setters and validation (one module each)."""

from taskfit.arguments.fit_arguments import FitArguments, read_config

__all__ = ["FitArguments", "read_config"]
