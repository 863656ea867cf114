"""PEFT adapter files in a checkpoint folder (HF/PEFT layout): what a ``PeftModel`` contributes instead of its
full weights, and how those files load back.

Layout (mirrors ``peft.PeftModel.save_pretrained``, which ``transformers.Trainer`` calls for a PEFT model)::

    adapter_model.safetensors      the "default" adapter's weights (adapter_model.bin with save_safetensors=False),
                                   keys as ``peft.get_peft_model_state_dict`` names them (no adapter name)
    adapter_config.json            its ``PeftConfig``, written by PEFT itself (``inference_mode`` true)
    {name}/adapter_model.*         every other adapter in a sub-folder named after it, with its
    {name}/adapter_config.json     own config

So ``PeftModel.from_pretrained(base, folder)`` reads the folder, and a folder ``transformers.Trainer`` wrote for a
PEFT model has the same files. ``peft`` is imported only when a PEFT model is seen (``pip install taskfit[peft]``).
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from taskfit.io.checkpoint_format import CheckpointError

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME_PT = "adapter_model.bin"
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME_PT, ADAPTER_CONFIG_NAME)


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (checked by class name, so ``peft`` is not imported for others)."""
    return any(c.__name__ == "PeftModel" and c.__module__.startswith("peft") for c in type(model).__mro__)


def adapter_parameter_names(model: Any) -> set[str]:
    """The names (``model.named_parameters()``'s) of the parameters a checkpoint of PEFT ``model`` keeps: the
    trainable ones and those of every adapter (an inactive adapter is frozen, yet PEFT saves it). The frozen base
    is left out: a resumed run takes it from the model the user builds again, as ``transformers.Trainer`` does.
    Sharded strategies gather only these (:meth:`~taskfit.strategies.strategy.Strategy.adapter_state_dict`)."""
    marks = tuple(f".{name}." for name in model.peft_config)
    return {n for n, p in model.named_parameters() if p.requires_grad or any(m in f".{n}." for m in marks)}


def _adapter_folder(name: str) -> str:
    """PEFT's rule: the "default" adapter at the top of the folder, any other one in a sub-folder named after it."""
    return "" if name == "default" else f"{name}/"



def _adapter_file(name: str, names: set[str], where: str) -> str:
    """The weights file of adapter ``name`` among the checkpoint's file ``names`` (safetensors first, as PEFT).

    Raises:
        CheckpointError: the folder holds neither file for that adapter.
    """
    folder = _adapter_folder(name)
    file = next((folder + n for n in (ADAPTER_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME_PT) if folder + n in names), None)
    if file is None:
        raise CheckpointError(f"{where!r} holds no weights for adapter {name!r} ({folder}{ADAPTER_WEIGHTS_NAME} "
                              f"or {folder}{ADAPTER_WEIGHTS_NAME_PT}); the folder has {sorted(names)[:8]}.")
    return file


def adapter_files(model: Any, state_dict: dict[str, torch.Tensor] | None = None,
                  safetensors: bool = True) -> dict[str, Any]:
    """``{file name: object}`` of every adapter of PEFT ``model`` in PEFT's layout (module docstring).

    Args:
        model (peft.PeftModel): the model (not wrapped by DDP/FSDP).
        state_dict (dict[str, Tensor] | None): the model's full state dict (default: ``model.state_dict()``); the
            adapters' tensors are taken from it, as ``PeftModel.save_pretrained(state_dict=...)`` does.
        safetensors (bool): ``adapter_model.safetensors`` (default) or ``adapter_model.bin``.

    Returns:
        dict: tensors dicts for the weights files, UTF-8 JSON ``bytes`` for the configs.
    """
    from peft import get_peft_model_state_dict

    files: dict[str, Any] = {}
    for name, config in model.peft_config.items():
        folder = _adapter_folder(name)
        weights = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=name,
                                            save_embedding_layers="auto")
        files[folder + (ADAPTER_WEIGHTS_NAME if safetensors else ADAPTER_WEIGHTS_NAME_PT)] = {
            k: v.detach().contiguous() for k, v in weights.items()}
        files[folder + ADAPTER_CONFIG_NAME] = _config_bytes(model, config)
    return files


def _config_bytes(model: Any, config: Any) -> bytes:
    """``adapter_config.json`` as PEFT writes it: ``PeftConfig.save_pretrained`` of a copy with
    ``inference_mode=True`` and the base model's ``name_or_path`` (its ``auto_mapping`` for a config without a
    task type), written into a temporary folder and read back, so the JSON is PEFT's own."""
    config = copy.deepcopy(config)
    if config.base_model_name_or_path is None:
        base = model.base_model if config.is_prompt_learning else model.base_model.model
        config.base_model_name_or_path = base.__dict__.get("name_or_path", None) or None
    config.inference_mode = True
    mapping = None
    if config.task_type is None:
        cls = model._get_base_model_class(is_prompt_tuning=config.is_prompt_learning)
        mapping = {"base_model_class": cls.__name__, "parent_library": cls.__module__}
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp, auto_mapping_dict=mapping)
        with open(os.path.join(tmp, ADAPTER_CONFIG_NAME), "rb") as f:
            return f.read()


def has_adapter_files(names: Any) -> bool:
    """Whether a folder listing (or a manifest's file names) holds a top-level adapter weights file."""
    names = set(names)
    return ADAPTER_WEIGHTS_NAME in names or ADAPTER_WEIGHTS_NAME_PT in names


def load_adapter_files(model: Any, names: Any, read: Callable[[str], Any], where: str) -> None:
    """Load the adapters of PEFT ``model`` from a folder in PEFT's layout (the inverse of :func:`adapter_files`):
    each adapter of the model from its weights file through ``peft.set_peft_model_state_dict`` (the values are
    copied, bit for bit). Mirrors the resume of ``transformers.Trainer._load_from_checkpoint`` (``load_adapter``
    per adapter, trainable), on the model's existing adapters.

    Args:
        model (peft.PeftModel): the model to load into.
        names (Iterable[str]): the folder's file names (a manifest's keys, or a listing).
        read (Callable[[str], dict[str, Tensor]]): reads one file of the folder by name.
        where (str): the folder, for errors.

    Raises:
        CheckpointError: an adapter of the model has no weights file in the folder, or its keys do not match.
    """
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    names = set(names)
    for name in model.peft_config:
        file = _adapter_file(name, names, where)
        state = read(file)
        expected = set(get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers="auto"))
        if set(state) != expected:
            raise CheckpointError(f"{where}/{file} does not match adapter {name!r} of {type(model).__name__}: missing "
                                  f"keys {sorted(expected - set(state))[:5]}, unexpected keys "
                                  f"{sorted(set(state) - expected)[:5]}.")
        set_peft_model_state_dict(model, state, adapter_name=name)


def adapter_state_by_model_key(model: Any, names: Any, read: Callable[[str], Any], where: str) -> dict[str, Any]:
    """Every adapter's tensors of a folder in PEFT's layout, keyed as ``model.state_dict()`` names them (adapter name
    inserted, ``modules_to_save`` wrapped): what a sharded strategy cuts into its shards and loads with
    ``set_model_state_dict``, where ``peft.set_peft_model_state_dict`` cannot load full tensors into sharded
    parameters. The key map is the inverse of the one :func:`adapter_files` writes with (``get_peft_model_state_dict``
    of the model's own keys), so a folder written by taskfit or by ``PeftModel.save_pretrained`` maps exactly.

    Args:
        model (peft.PeftModel): the model whose adapters the folder holds (its parameters may be sharded DTensors:
            only the names are read).
        names, read, where: as :func:`load_adapter_files`.

    Returns:
        dict[str, Tensor]: full tensors by the model's state-dict key.

    Raises:
        CheckpointError: as :func:`load_adapter_files`.
    """
    from peft import get_peft_model_state_dict

    keys = sorted(adapter_parameter_names(model) | {k for k in model.state_dict() if ".modules_to_save." in k})
    markers = {k: torch.tensor(i) for i, k in enumerate(keys)}  # each value says which model key it came from
    names = set(names)
    out: dict[str, Any] = {}
    for name in model.peft_config:
        file = _adapter_file(name, names, where)
        key_of = {k: keys[int(v)] for k, v in get_peft_model_state_dict(
            model, state_dict=markers, adapter_name=name, save_embedding_layers="auto").items()}
        state = read(file)
        if set(state) != set(key_of):
            raise CheckpointError(f"{where}/{file} does not match adapter {name!r} of {type(model).__name__}: missing "
                                  f"keys {sorted(set(key_of) - set(state))[:5]}, unexpected keys "
                                  f"{sorted(set(state) - set(key_of))[:5]}.")
        out.update({key_of[k]: v for k, v in state.items()})
    return out


def merged_copy(model: Any, state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """A copy of PEFT ``model`` with its adapters merged into the base weights: the base architecture (e.g. a
    ``LlamaForCausalLM``) that ``from_pretrained`` reads back with no PEFT installed. ``model`` keeps its adapters
    (mirrors ``PeftModel.merge_and_unload``, which changes the model it is called on; here it runs on a deep copy,
    so the copy needs one more model's worth of memory for a moment).

    Args:
        model (peft.PeftModel): the model (not wrapped by DDP/FSDP), adapters of a kind PEFT can merge (LoRA and
            its variants; prompt learning cannot be merged).
        state_dict (dict[str, Tensor] | None): full weights to put into the copy first (a sharded strategy's
            gathered state dict); default: the model's own.

    Raises:
        ValueError: ``model`` is not a PEFT model, or its adapters cannot be merged (naming the PEFT type).
    """
    if not is_peft_model(model):
        raise ValueError(f"merge_adapters=True needs a peft.PeftModel; the model is a {type(model).__name__} "
                         "(there are no adapters to merge).")
    kinds = sorted({str(c.peft_type) for c in model.peft_config.values()})
    if not hasattr(model.base_model, "merge_and_unload") or any(c.is_prompt_learning for c in model.peft_config.values()):
        raise ValueError(f"merge_adapters=True: PEFT cannot merge {', '.join(kinds)} adapters into the base "
                         "weights (LoRA-like adapters can); save the adapter instead (merge_adapters=False).")
    copy_ = copy.deepcopy(model)
    if state_dict is not None:
        copy_.load_state_dict(state_dict)
    return copy_.merge_and_unload()
