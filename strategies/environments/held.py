"""The rank variables of a worker that taskfit's script launcher started, held back until ``launch()``.

A worker re-runs the whole script. Had it ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` from its start, code above
``launch()`` would see a distributed run in the workers only (rank 0 learns its rank at ``launch()``), and libraries
that form a process group on seeing these variables would do so in the workers alone: Accelerate's ``PartialState``,
which ``transformers.TrainingArguments`` builds, joins the rendezvous there with its own backend and timeout.
So the launcher passes them packed in one taskfit variable, and :func:`export_held` puts them into ``os.environ``
when the strategy launches; until then every process of a ``python train.py`` run looks like one plain process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

#: the variable that carries the held-back rank variables (JSON object of str -> str)
HELD = "TASKFIT_RANK_ENV"
#: the variables a worker does not see before ``launch()``: those that make a library think it runs distributed
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def hold_back(env: Mapping[str, str], rank_variables: Mapping[str, str]) -> dict[str, str]:
    """A worker's start environment: ``env`` without any :data:`RANK_VARIABLES`, with ``rank_variables`` (the
    worker's ``RANK``, ``LOCAL_RANK``, ...) packed under :data:`HELD`."""
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
