"""``load_from_checkpoint`` of ``TaskModule`` and ``DataModule``: rebuild the object from the hyperparameters a
checkpoint folder saved (``config.json``), then load its weights (mirrors Lightning's ``core/saving.py``)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
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


def load_module(cls: type, checkpoint_path: str, map_location: Any = None, hparams_file: str | None = None,
                strict: bool | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """``cls`` rebuilt from the checkpoint's hyperparameters (``overrides`` win; see
    :func:`taskfit.core.hparams.rebuild_kwargs`), ``on_load_checkpoint`` called, its weights loaded, on
    ``map_location`` (default CPU), in training mode (as Lightning's; call ``.eval()`` to predict).

    Raises:
        FileNotFoundError: no checkpoint or no weights at ``checkpoint_path``.
        RuntimeError: the weights do not fit the module and ``strict`` (default: ``module.strict_loading``, True)
            is not False.
    """
    checkpoint_path = os.fspath(checkpoint_path)
    hparams, name = read_hparams(checkpoint_path, hparams_file)
    weights = _read_weights(checkpoint_path, map_location)
    model = cls(**rebuild_kwargs(cls, hparams, name, overrides or {}))
    model.on_load_checkpoint({"state_dict": weights, "hyper_parameters": hparams, "hparams_name": name})
    if strict is None:
        strict = getattr(model, "strict_loading", True) is not False
    model.load_state_dict(_in_module_order(weights, model), strict=strict)
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
