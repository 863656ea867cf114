"""``HfArgumentParser`` for HF-style scripts: ``transformers.HfArgumentParser`` that also parses taskfit's
``TrainingArguments``.

transformers' parser builds one ``argparse`` option per dataclass field from the field's type, and refuses types it
cannot turn into one converter: a union of several non-string types such as taskfit's Lightning-style
``fast_dev_run: bool | int`` or ``limit_train_batches: int | float | None``. For taskfit's ``TrainingArguments``
this subclass parses every field that transformers' ``Seq2SeqTrainingArguments`` also has with transformers' own
type for it (so the options and their spellings are exactly HF's), and gives each taskfit-only field of such a
type a plain text option; ``TrainingArguments`` converts (and validates) the values as it does for the
``taskfit fit`` command line, so ``--limit_train_batches 0.25`` is the fraction 0.25 and ``--fast_dev_run 5`` five
batches. Every other dataclass (a script's ``ModelArguments``) is parsed by transformers' own code unchanged, and
the JSON / YAML / dict forms (``parse_json_file``, ``parse_yaml_file``, ``parse_dict``) are transformers'. The
dataclass's own field types are left as they are (transformers' parser narrows ``field.type`` in place).

Mirrors ``transformers.HfArgumentParser`` (transformers 5.x, which must be installed).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from typing import Any, get_type_hints

try:
    from transformers import HfArgumentParser as _HfArgumentParser
except ImportError:  # transformers is optional for taskfit itself
    _HfArgumentParser = None


def _plain(hint: Any) -> bool:
    """A type transformers' parser converts correctly: ``str``/``int``/``float``/``bool``, or one of them or
    None (taskfit-only fields of other types, e.g. ``devices: int | str | list[int]``, become text options)."""
    import types
    import typing

    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    rest = [a for a in args if a is not type(None)]
    return len(rest) == 1 and rest[0] in (str, int, float, bool)


if _HfArgumentParser is not None:
    class HfArgumentParser(_HfArgumentParser):
        """``transformers.HfArgumentParser`` (same constructor and ``parse_*`` methods) that also takes fields whose
        type transformers' parser refuses; see the module docstring.

        Args:
            dataclass_types: one dataclass type or several (``ModelArguments, DataTrainingArguments,
                TrainingArguments``).
            **kwargs: passed to ``argparse.ArgumentParser``.
        """

        def _add_dataclass_arguments(self, dtype: Any) -> None:
            from taskfit.arguments import FitArguments

            if not (isinstance(dtype, type) and issubclass(dtype, FitArguments)):
                return super()._add_dataclass_arguments(dtype)  # a script's own dataclasses: transformers' code
            from transformers import Seq2SeqTrainingArguments

            parser = self.add_argument_group(dtype._argument_group_name) \
                if hasattr(dtype, "_argument_group_name") else self
            own, theirs = get_type_hints(dtype), get_type_hints(Seq2SeqTrainingArguments)
            for field in dataclasses.fields(dtype):
                if not field.init:
                    continue
                option = copy.copy(field)  # never narrow the dataclass's own field types
                option.type = theirs.get(field.name, own[field.name])  # HF's fields: parsed as HF parses them
                try:  # dry run on a scratch parser: transformers raises for types it cannot convert
                    if field.name not in theirs and not _plain(own[field.name]):
                        raise TypeError(f"{own[field.name]} has no single converter")
                    scratch = argparse.ArgumentParser()
                    self._parse_dataclass_field(scratch, copy.copy(option))
                    if field.default not in (None, dataclasses.MISSING) and scratch.get_default(field.name) is None:
                        raise TypeError("transformers gives this option no default")  # a list with a str default
                except (TypeError, ValueError):
                    default = (field.default_factory() if field.default_factory is not dataclasses.MISSING
                               else field.default)
                    names = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name
                                                   else [])
                    parser.add_argument(*names, dest=field.name, type=str, default=default,
                                        help=f"{field.metadata.get('help', '')} (text, converted by the dataclass)")
                    continue
                self._parse_dataclass_field(parser, option)
            return None
else:
    class HfArgumentParser:  # type: ignore[no-redef]
        """Placeholder when transformers is not installed: using it raises ImportError."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("HfArgumentParser builds on transformers.HfArgumentParser: pip install transformers")


__all__ = ["HfArgumentParser"]
