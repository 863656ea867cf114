"""``load_from_checkpoint`` of ``TaskModule`` and ``DataModule``: rebuild the object from the hyperparameters a
checkpoint folder saved (``config.json``), then load its weights (mirrors Lightning's ``core/saving.py``)."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch
from taskfit.core.hooks import overrides as is_overridden
from taskfit.core.hparams import rebuild_kwargs

__all__ = ["load_datamodule", "load_module", "read_hparams"]


def _read_hparams_file(io: Any, hparams_file: str) -> dict[str, Any]:
    """The hyperparameters of a YAML (``hparams.yaml``, as loggers write it) or JSON file."""
    text = io.read_bytes(str(hparams_file)).decode()
    if str(hparams_file).endswith((".yaml", ".yml")):
        import yaml

        return dict(yaml.safe_load(text) or {})
    return dict(json.loads(text))


def read_hparams(checkpoint_path: str, hparams_file: str | None = None,
                 key: str = "hyper_parameters") -> tuple[dict[str, Any], str | None]:
    """``(hyperparameters, hparams_name)`` saved in the checkpoint folder ``checkpoint_path`` (its ``config.json``),
    updated by ``hparams_file``'s. ``key``: ``"hyper_parameters"`` (the module's) or
    ``"datamodule_hyper_parameters"``.

    Raises:
        FileNotFoundError: ``checkpoint_path`` does not exist (Lightning's message).
    """
    from taskfit.io.checkpoint_io import TorchCheckpointIO, join

    io = TorchCheckpointIO()
    checkpoint_path = os.fspath(checkpoint_path)
    if not io.exists(checkpoint_path):
        raise FileNotFoundError(f"Checkpoint file not found: {checkpoint_path} (a checkpoint folder holds "
                                "model.safetensors or pytorch_model.bin).")
    config: dict[str, Any] = {}
    if io.exists(join(checkpoint_path, "config.json")):
        config = json.loads(io.read_bytes(join(checkpoint_path, "config.json")))
    hparams = dict(config.get(key) or {})
    name = config.get("hparams_name" if key == "hyper_parameters" else "datamodule_hparams_name")
    if hparams_file is not None:
        hparams.update(_read_hparams_file(io, hparams_file))
    return hparams, name


def _read_weights(checkpoint_path: str, map_location: Any) -> dict[str, torch.Tensor]:
    from taskfit.io.checkpoint_io import TorchCheckpointIO, deserialize, join

    io = TorchCheckpointIO()
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = join(checkpoint_path, name)
        if io.exists(path):
            return deserialize(name, io.read_bytes(path), map_location="cpu")
    raise FileNotFoundError(f"{checkpoint_path!r} holds no model.safetensors or pytorch_model.bin.")


def _in_module_order(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``weights`` in the order ``model.state_dict()`` has them, extra keys after, grouped by submodule with
    ``weight`` before ``bias`` as torch layers register them: a safetensors file does not keep the saved order, and
    ``load_state_dict``'s "Unexpected key(s)" message lists keys in the order given (Lightning's file keeps it)."""
    expected = [k for k in model.state_dict() if k in weights]
    known = set(expected)
    extra = [k for k in weights if k not in known]
    rank = {"weight": 0, "bias": 1}
    extra.sort(key=lambda k: (k.rpartition(".")[0], rank.get(k.rpartition(".")[2], 2), k))
    return {k: weights[k] for k in expected + extra}


def _strictness(model: Any, strict: bool | None) -> bool:
    """``strict`` of a ``load_from_checkpoint`` call, else the module's ``strict_loading`` (default True).

    Raises:
        ValueError: both are set and differ (Lightning's message).
    """
    own = vars(model).get("strict_loading")
    if own is not None and strict is not None and strict != own:
        raise ValueError(f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with "
                         f"`{type(model).__name__}.strict_loading={own!r}. Please set the same value for both of them.")
    return bool(own if strict is None and own is not None else (True if strict is None else strict))


def load_module(cls: type, checkpoint_path: str, map_location: Any = None, hparams_file: str | None = None,
                strict: bool | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """``cls`` rebuilt from the checkpoint's hyperparameters (``overrides`` win; see
    :func:`taskfit.core.hparams.rebuild_kwargs`), ``configure_model`` (when overridden) and ``on_load_checkpoint``
    called, its weights loaded (not strict: Lightning's warnings name the keys that did not fit), on
    ``map_location`` (default CPU), in training mode (as Lightning's; call ``.eval()`` to predict).

    Raises:
        FileNotFoundError: no checkpoint or no weights at ``checkpoint_path``.
        RuntimeError: the weights do not fit the module and ``strict`` (default: ``module.strict_loading``, True)
            is not False.
        ValueError: ``strict`` and the module's ``strict_loading`` are both set and differ (Lightning's message).
    """
    checkpoint_path = os.fspath(checkpoint_path)
    hparams, name = read_hparams(checkpoint_path, hparams_file)
    weights = _read_weights(checkpoint_path, map_location)
    model = cls(**rebuild_kwargs(cls, hparams, name, overrides or {}))
    strict = _strictness(model, strict)
    if is_overridden(model, "configure_model"):  # Lightning builds lazily made layers before loading into them
        model.configure_model()
    model.on_load_checkpoint({"state_dict": weights, "hyper_parameters": hparams, "hparams_name": name})
    keys = model.load_state_dict(_in_module_order(weights, model), strict=strict)
    if not strict and keys is not None and keys.missing_keys:
        warnings.warn("Found keys that are in the model state dict but not in the checkpoint: "
                      f"{keys.missing_keys}", UserWarning, stacklevel=3)
    if not strict and keys is not None and keys.unexpected_keys:
        warnings.warn("Found keys that are not in the model state dict but in the checkpoint: "
                      f"{keys.unexpected_keys}", UserWarning, stacklevel=3)
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        model.to(torch.device(map_location) if isinstance(map_location, str) else map_location)
    return model  # in training mode, as Lightning returns it


def load_datamodule(cls: type, checkpoint_path: str, hparams_file: str | None = None,
                    overrides: dict[str, Any] | None = None) -> Any:
    """``cls`` (a ``DataModule``) rebuilt from the datamodule hyperparameters a checkpoint saved (``overrides``
    win), as Lightning's ``LightningDataModule.load_from_checkpoint``; the datamodule's ``state_dict`` is restored
    by a run resumed from the checkpoint, not here.

    Raises:
        FileNotFoundError: no checkpoint at ``checkpoint_path``.
    """
    hparams, name = read_hparams(os.fspath(checkpoint_path), hparams_file, key="datamodule_hyper_parameters")
    return cls(**rebuild_kwargs(cls, hparams, name, overrides or {}))
