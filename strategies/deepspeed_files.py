"""Safe reading of the DeepSpeed engine's checkpoint files (F-CKPT-5). DeepSpeed loads its own files with
``torch.load(weights_only=False)``, which runs whatever code a crafted file names. taskfit instead reads every
engine file once, verifies it against the checkpoint's manifest and unpickles it with ``weights_only=True``
allowing exactly the DeepSpeed classes its files hold (:data:`DEEPSPEED_SAFE_GLOBALS`).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator
from typing import Any

import torch

#: the non-torch globals DeepSpeed's checkpoint files pickle (ZeRO stage enum, loss scaler, fragment addresses)
DEEPSPEED_SAFE_GLOBAL_NAMES = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def deepspeed_safe_globals() -> list[Any]:
    """The classes of :data:`DEEPSPEED_SAFE_GLOBAL_NAMES` (imports DeepSpeed)."""
    import importlib

    out = []
    for name in DEEPSPEED_SAFE_GLOBAL_NAMES:
        module, attr = name.rsplit(".", 1)
        with contextlib.suppress(ImportError, AttributeError):
            out.append(getattr(importlib.import_module(module), attr))
    return out


def load_engine_file(data: bytes, where: str, map_location: Any = "cpu", weights_only: bool = True) -> Any:
    """Unpickle the bytes of one DeepSpeed engine file (``torch.save`` format).

    Raises:
        UnsafeCheckpointError: ``weights_only`` and the file needs a global outside torch's safe set and
            :data:`DEEPSPEED_SAFE_GLOBAL_NAMES` (names the file).
    """
    from taskfit.io.checkpoint_io import UnsafeCheckpointError

    if not weights_only:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)
    try:
        with torch.serialization.safe_globals(deepspeed_safe_globals()):
            return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"Refusing to load {where}: it holds pickled objects outside the DeepSpeed classes taskfit allows, and "
            "unpickling them could run arbitrary code. If you trust this checkpoint, resume with "
            f"weights_only=False. torch said: {str(exc).splitlines()[0]}") from exc


@contextlib.contextmanager
def verified_engine_loads(engine: Any, reader: Any, local_folder: str) -> Iterator[None]:
    """While active, the engine's checkpoint engine loads each file from ``local_folder`` through ``reader`` (a
    :class:`~taskfit.io.checkpoint_format.CheckpointReader`): one read, checked against the manifest, unpickled
    with :func:`load_engine_file` (following ``reader.weights_only``)."""
    ckpt_engine = engine.checkpoint_engine
    original = ckpt_engine.load

    def load(path: str, map_location: Any = None, **_: Any) -> Any:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(local_folder)).replace(os.sep, "/")
        data = reader.read_bytes(rel)  # CheckpointError for a file outside the manifest or the folder
        return load_engine_file(data, repr(path), map_location or "cpu", reader.weights_only)

    ckpt_engine.load = load
    try:
        yield
    finally:
        ckpt_engine.load = original


@contextlib.contextmanager
def trainable_module_state(engine: Any) -> Iterator[None]:
    """While active, ``engine.module_state_dict`` (what ``engine.save_checkpoint`` writes as the module) keeps only
    the trainable parameters: the adapter of a PEFT model. DeepSpeed's ``exclude_frozen_parameters`` drops the
    frozen parameters but keeps what a module writes beside them, such as bitsandbytes' quantization constants of a
    frozen 4-bit base (``weight.absmax``, ``weight.quant_map``...), which resume would not read back (the base
    comes from the model built again)."""
    original = engine.module_state_dict
    trainable = {name for name, p in engine.module.named_parameters(remove_duplicate=False) if p.requires_grad}

    def module_state_dict(*args: Any, **kwargs: Any) -> Any:
        state = original(*args, **kwargs)
        prefix = kwargs.get("prefix", "")
        return state if state is None else type(state)(
            (k, v) for k, v in state.items() if k[len(prefix):] in trainable)

    engine.module_state_dict = module_state_dict
    try:
        yield
    finally:
        del engine.module_state_dict  # the class's method again
