"""Stateful streaming data: resuming an iterable training loader from its saved state instead of re-reading the
consumed batches (mirrors the ``state_dict``/``load_state_dict`` protocol of torchdata's ``StatefulDataLoader``
and of ``datasets.IterableDataset``).

The state is this process's own (each rank reads its own share of a stream) and is stored as JSON, never pickled:
:func:`encode_state` turns tensors and non-string dict keys into tagged JSON objects, :func:`decode_state` reverses
it exactly.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

log = logging.getLogger("taskfit")

#: the checkpoint file holding global rank ``r``'s data state (formatted with ``rank=r``)
DATA_STATE_NAME = "data_state_{rank}.json"

_TENSOR, _ITEMS, _TUPLE = "__taskfit_tensor__", "__taskfit_items__", "__taskfit_tuple__"
_warned: set[str] = set()  # reasons already warned about in this process (one warning per reason)


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning(reason)


def stateful_source(loader: Any) -> Any | None:
    """The object whose ``state_dict()`` is the exact position of ``loader`` in its epoch, or None (the run then
    resumes mid-epoch by reading and dropping the consumed batches, :func:`~taskfit.data.loaders.skip_first_batches`).

    - a loader with ``state_dict``/``load_state_dict`` itself (torchdata's ``StatefulDataLoader``, a custom
      loader): the loader, which tracks its worker processes itself;
    - a ``DataLoader`` over an ``IterableDataset`` with ``state_dict``/``load_state_dict`` (a ``datasets``
      streaming dataset, a user's stream): the dataset, when it is iterated in this process (``num_workers=0``);
      with worker processes the dataset's copies live there and the main process's copy never moves, so the
      skip is kept, with a one-time warning saying so.

    Map-style loaders return None: their sampler already resumes without loading the skipped samples.

    Args:
        loader (DataLoader | Iterable): the training loader.
    """
    if _is_stateful(loader):
        return loader
    dataset = getattr(loader, "dataset", None)
    if not (isinstance(loader, DataLoader) and isinstance(dataset, IterableDataset) and _is_stateful(dataset)):
        return None
    if loader.num_workers > 0:  # asked once per run: one warning per run
        log.warning(f"The training {type(dataset).__name__} has state_dict()/load_state_dict(), but the DataLoader "
                   f"reads it in {loader.num_workers} worker process(es), whose copies of the dataset hold the "
                   "position, not this process's: a mid-epoch resume reads and drops the consumed batches instead. "
                   "Use dataloader_num_workers=0, or wrap the dataset in torchdata's StatefulDataLoader, to resume "
                   "from the saved state.")
        return None
    return dataset


def encode_state(obj: Any, where: str = "state") -> Any:
    """``obj`` (a ``state_dict()``: dicts, lists, tuples, str/int/float/bool/None, tensors) as plain JSON values;
    :func:`decode_state` gives it back exactly (tensors with their dtype and shape, tuples, non-string keys).

    Raises:
        TypeError: a value of another type (names where in the state it is).
    """
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {_TENSOR: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                          "data": t.reshape(-1).tolist()}}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: encode_state(v, f"{where}[{k!r}]") for k, v in obj.items()}
        return {_ITEMS: [[encode_state(k, where), encode_state(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_state(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_state(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"The data state holds a {type(obj).__name__} at {where}; only JSON values, tuples and tensors "
                    "can be saved without pickling.")


def decode_state(obj: Any) -> Any:
    """The inverse of :func:`encode_state`.

    Raises:
        ValueError: a tagged tensor whose data does not fit its shape or dtype.
    """
    if isinstance(obj, list):
        return [decode_state(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {_TENSOR}:
        spec = obj[_TENSOR]
        dtype = getattr(torch, str(spec["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"Unknown tensor dtype {spec['dtype']!r} in a saved data state.")
        return torch.tensor(spec["data"], dtype=dtype).reshape(spec["shape"])
    if set(obj) == {_ITEMS}:
        return {decode_state(k): decode_state(v) for k, v in obj[_ITEMS]}
    if set(obj) == {_TUPLE}:
        return tuple(decode_state(v) for v in obj[_TUPLE])
    return {k: decode_state(v) for k, v in obj.items()}


def capture_state(source: Any | None) -> Any | None:
    """``source.state_dict()`` encoded for JSON (:func:`encode_state`), or None without a source or when the state
    cannot be stored without pickling (then a one-time warning: a resume falls back to the skip)."""
    if source is None:
        return None
    try:
        return encode_state(source.state_dict())
    except TypeError as err:
        _warn_once(f"The training data's state is not saved ({err}); a mid-epoch resume reads and drops the "
                   "consumed batches instead.")
        return None
