"""The rank variables of a worker that taskfit's script launcher started, held back until ``launch()``.

A worker re-runs the whole script. Had it ``LOCAL_RANK``/``WORLD_SIZE`` from its start, libraries that conclude
from them that they run distributed would form a process group above ``launch()`` in the workers alone (the first
process learns its rank variables only at ``launch()``): Accelerate's ``PartialState``, which
``transformers.TrainingArguments`` builds, joins the rendezvous there with its own backend and timeout. So the
launcher passes ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` packed in one taskfit variable, and
:func:`export_held` puts them into ``os.environ`` when the strategy launches. ``RANK`` alone makes no library form
a group; it stays visible from the start, so ``os.environ.get("RANK", "0")`` is right in every process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

#: the variable that carries the held-back rank variables (JSON object of str -> str)
HELD = "TASKFIT_RANK_ENV"
#: the variables a worker does not see before ``launch()``: those from which Accelerate (``LOCAL_RANK``; ``WORLD_SIZE``
#: with ``use_cpu``), DeepSpeed and ``torch.distributed``'s ``env://`` conclude that they run distributed
RANK_VARIABLES = ("LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def hold_back(env: Mapping[str, str], rank_variables: Mapping[str, str]) -> dict[str, str]:
    """A worker's start environment: ``env`` without any :data:`RANK_VARIABLES`, with ``rank_variables`` (the
    worker's ``LOCAL_RANK``, ``WORLD_SIZE``, ...) packed under :data:`HELD`."""
    out = {k: v for k, v in env.items() if k not in RANK_VARIABLES and k != HELD}
    out[HELD] = json.dumps(dict(rank_variables))
    return out


def held() -> dict[str, str]:
    """The rank variables this process holds back (empty outside a worker of the script launcher, and after
    :func:`export_held`)."""
    raw = os.environ.get(HELD)
    return json.loads(raw) if raw else {}


def lookup(name: str, default: str | None = None) -> str | None:
    """The rank variable ``name``: from ``os.environ``, else held back, else ``default``."""
    value = os.environ.get(name)
    return value if value is not None else held().get(name, default)


def export_held() -> None:
    """Put the held-back rank variables into ``os.environ`` (the worker's ``launch()``); a no-op elsewhere."""
    values = held()
    if values:
        os.environ.update(values)
        del os.environ[HELD]
