"""Options given as a dict, a JSON object string or the path of a JSON file (``fsdp_config``, ``deepspeed``,
``accelerator_config``, as HF accepts them), read into a plain dict. Below every package that reads such an option,
so strategies need not import the arguments package."""

from __future__ import annotations

import json
from typing import Any

from taskfit.redact import redact_text  # option text in messages: no credential shown


def load_json_object(value: Any, what: str) -> dict:
    """A copy of an option that takes a dict, a JSON object string (``'{...}'``) or the path of a JSON file
    (``fsdp_config``, ``deepspeed``, ``accelerator_config``, as HF accepts them); ``None``/``""`` -> ``{}``.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: text or file content that is not a JSON object.
        TypeError: any other type.
    """
    import copy
    import os

    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return copy.deepcopy(value)
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a dict, a JSON string or a path; got {type(value).__name__}.")
    text = str(value)
    if not text.strip().startswith("{"):
        if not os.path.isfile(text):
            raise FileNotFoundError(f"{what} file {redact_text(repr(text))} does not exist ({what} takes a dict, a JSON string or "
                                    "the path of a JSON file).")
        with open(text, encoding="utf-8") as fh:
            text = fh.read()
    try:
        decoded = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what} {redact_text(repr(str(value)[:80]))} is not valid JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise ValueError(f"{what} must be a JSON object; got {type(decoded).__name__}.")
    return decoded
