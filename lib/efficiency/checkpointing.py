"""Gradient checkpointing (F-MEM-1): HF ``gradient_checkpointing`` / ``gradient_checkpointing_kwargs``.

Hugging Face models (anything with ``activation_checkpointing_enable`` or, before transformers 5,
``gradient_checkpointing_enable``) use their own switch, as HF ``Trainer`` does. Any other module gets ``torch.utils.checkpoint.checkpoint`` around the forward of chosen layers. The layers
are named, first match wins, by

1. ``gradient_checkpointing_kwargs={"layers": [...]}``: classes or class names (``"Block"``);
2. a ``gradient_checkpointing_layers`` attribute on the TaskModule (a class, a class name, or a tuple of them);
3. by default, every element of every ``nn.ModuleList`` (the repeated blocks of a transformer-style model).

The other keys of ``gradient_checkpointing_kwargs`` go to ``torch.utils.checkpoint.checkpoint``
(``use_reentrant``, default False here; ``preserve_rng_state``, ``determinism_check``, ``debug``,
``context_fn``). Only the forward is replaced (an instance attribute), so state-dict keys do not change.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from taskfit.registry import invalid_choice

#: ``torch.utils.checkpoint.checkpoint`` options accepted in ``gradient_checkpointing_kwargs``
CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug", "context_fn")
_MARK = "_taskfit_checkpointed_forward"


def hf_models(module: nn.Module) -> list[nn.Module]:
    """The outermost submodules of ``module`` (itself included) with HF's switch: ``activation_checkpointing_enable``
    (transformers >= 5) or ``gradient_checkpointing_enable``."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        if callable(getattr(m, "gradient_checkpointing_enable", None)) or callable(
                getattr(m, "activation_checkpointing_enable", None)):
            found.append(m)
            return
        for child in m.children():
            visit(child)

    visit(module)
    return found


def _checkpointed(layer: nn.Module, original: Any, options: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    if layer.training and torch.is_grad_enabled():
        return checkpoint(original, *args, **options, **kwargs)
    return original(*args, **kwargs)


def _matches(module: nn.Module, layers: tuple[Any, ...]) -> bool:
    return any(isinstance(module, ly) if isinstance(ly, type) else type(module).__name__ == ly for ly in layers)


def _select_layers(module: nn.Module, layers: Any) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` of the outermost modules matching ``layers`` (or the ModuleList elements by default).

    Raises:
        ValueError: a named class that no submodule has (lists the class names present), or no layer at all.
    """
    if layers is not None:
        layers = tuple(layers) if isinstance(layers, (list, tuple, set)) else (layers,)
        present = {type(m).__name__ for m in module.modules()}
        for ly in layers:
            if not isinstance(ly, (type, str)):
                raise TypeError(f"gradient checkpointing layers must be classes or class names, got {ly!r}.")
            if isinstance(ly, str) and ly not in present:
                raise invalid_choice("gradient checkpointing layer class", ly, present)
        chosen, skip = [], set()
        for name, m in module.named_modules():
            if any(name.startswith(s + ".") for s in skip) or m is module:
                continue
            if _matches(m, layers):
                chosen.append((name, m))
                skip.add(name)
    else:
        chosen = [(f"{name}.{i}", child) for name, m in module.named_modules() if isinstance(m, nn.ModuleList)
                  for i, child in enumerate(m)]
    if not chosen:
        raise ValueError(f"gradient_checkpointing=True found no layer to checkpoint in {type(module).__name__}: name "
                         "the layer classes with gradient_checkpointing_kwargs={'layers': ['Block']} or a "
                         "`gradient_checkpointing_layers = (Block,)` attribute on the TaskModule.")
    return chosen


def enable_gradient_checkpointing(module: nn.Module, kwargs: dict[str, Any] | None = None) -> list[str]:
    """Turn on gradient checkpointing for ``module`` (mirrors ``PreTrainedModel.gradient_checkpointing_enable``).

    Activations inside each checkpointed layer are dropped after the forward and recomputed in backward: less
    memory (roughly one layer's activations instead of all of them), about 20-30 % more compute, same gradients.

    Args:
        module (nn.Module): the TaskModule (or any module) to train.
        kwargs (dict | None): ``gradient_checkpointing_kwargs``: ``layers`` (taskfit, see the module docstring)
            plus ``torch.utils.checkpoint.checkpoint`` options (for HF models: passed to their switch as is).

    Returns:
        list[str]: the names of the modules switched on (HF models) or wrapped (layers).

    Raises:
        ValueError: an unknown option (names it and the valid ones); a layer class name no submodule has; no
            layer found; an HF model that does not support gradient checkpointing (HF's own error).
        TypeError: a ``layers`` entry that is neither a class nor a class name.
    """
    options = dict(kwargs or {})
    layers = options.pop("layers", None)
    if layers is None:
        layers = getattr(module, "gradient_checkpointing_layers", None)
    names = {id(m): n for n, m in module.named_modules()}
    if layers is None:
        hf = hf_models(module)
        if hf:
            for m in hf:
                if callable(getattr(m, "activation_checkpointing_enable", None)):
                    m.activation_checkpointing_enable(activation_checkpointing_kwargs=options or None)
                else:
                    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None)
            return [names.get(id(m), "") for m in hf]
    for key in options:
        if key not in CHECKPOINT_OPTIONS:
            raise invalid_choice("gradient_checkpointing_kwargs key", key, (*CHECKPOINT_OPTIONS, "layers"))
    options.setdefault("use_reentrant", False)
    chosen = _select_layers(module, layers)
    for _, layer in chosen:
        if _MARK not in layer.__dict__:
            original = layer.forward
            layer.__dict__[_MARK] = original
            layer.forward = functools.partial(_checkpointed, layer, original, options)
    return [name for name, _ in chosen]


def disable_gradient_checkpointing(module: nn.Module) -> None:
    """Undo :func:`enable_gradient_checkpointing` (HF models through their ``*_checkpointing_disable``)."""
    for m in module.modules():
        if _MARK in m.__dict__:
            del m.__dict__["forward"]
            del m.__dict__[_MARK]
    for m in hf_models(module):
        for name in ("activation_checkpointing_disable", "gradient_checkpointing_disable"):
            if callable(getattr(m, name, None)):
                getattr(m, name)()
                break
