"""Writing ``output_dir/checkpoint-{global_step}/`` and the final model (F-CORE-7; the full checkpoint feature
set, resume and rotation build on this in the checkpoint issue).

Layout of a checkpoint folder::

    model.safetensors      model weights (pytorch_model.bin with save_safetensors=False); HF models use
                           save_pretrained, which also writes config.json
    training_state.pt      optimizer, LR scheduler, precision plugin, loop state, control flags, callback
                           states and RNG states (python, numpy, torch)
    fit_args.json          the FitArguments of the run
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from taskfit.__about__ import __version__

if TYPE_CHECKING:
    from taskfit.fit import Fit

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_NAME_PT = "pytorch_model.bin"


def rng_states() -> dict[str, Any]:
    """RNG states of python, numpy and torch (CPU) to store in a checkpoint, as plain values and tensors so
    ``torch.load(weights_only=True)`` reads them."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
            "torch": torch.get_rng_state()}


def checkpoint_path(fit: Fit) -> str:
    """``output_dir/checkpoint-{global_step}``: where the checkpoint of the current step goes."""
    return os.path.join(fit.args.output_dir, f"checkpoint-{fit.state.global_step}")


def exportable_model(model: torch.nn.Module) -> torch.nn.Module:
    """What ``save_model`` writes: the model itself, or, for a module that only wraps one HF-style model (a
    child with ``save_pretrained`` holding every parameter), that child, so the folder loads with
    ``from_pretrained``."""
    if hasattr(model, "save_pretrained"):
        return model
    children = [m for m in model.children() if hasattr(m, "save_pretrained")]
    if len(children) == 1:
        n_all = sum(p.numel() for p in model.parameters())
        if sum(p.numel() for p in children[0].parameters()) == n_all:
            return children[0]
    return model


def save_model_folder(fit: Fit, folder: str) -> None:
    """Write the unwrapped model's weights (and config) into ``folder`` (created when missing).

    HF-style models (with ``save_pretrained``, also when a TaskModule only wraps one, see
    :func:`exportable_model`) are saved through it, so ``from_pretrained`` reads them back; other modules get ``model.safetensors`` plus ``config.json`` naming the class and parameter count.
    """
    os.makedirs(folder, exist_ok=True)
    model = exportable_model(fit.model)
    safe = fit.args.save_safetensors is not False
    state = fit.strategy.model_state_dict(model)
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, state_dict=state, safe_serialization=safe)
    else:
        name = WEIGHTS_NAME if safe else WEIGHTS_NAME_PT
        fit.strategy.checkpoint_io.save_weights(state, os.path.join(folder, name), safetensors=safe)
        config = {"class": f"{type(model).__module__}.{type(model).__qualname__}",
                  "num_parameters": sum(p.numel() for p in model.parameters()), "taskfit_version": __version__}
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    processor = fit.processing_class
    if processor is not None and hasattr(processor, "save_pretrained"):
        processor.save_pretrained(folder)


def save_checkpoint(fit: Fit) -> str:
    """Write ``output_dir/checkpoint-{global_step}/`` on rank zero; returns its path.

    The folder is assembled under a temporary name and renamed into place, so a crash mid-save never leaves a
    folder named ``checkpoint-N`` that is incomplete.
    """
    final = checkpoint_path(fit)
    if not fit.is_global_zero:
        return final
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_model_folder(fit, tmp)
    training_state = {
        "optimizer": fit.optimizer.state_dict() if fit.optimizer is not None else None,
        "lr_scheduler": fit.lr_scheduler.state_dict() if fit.lr_scheduler is not None else None,
        "precision": fit.strategy.precision.state_dict(),
        "state": fit.state.state_dict(),
        "control": fit.control.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in fit.callbacks if hasattr(cb, "state_dict")},
        "rng": rng_states(),
        "taskfit_version": __version__,
    }
    fit._hooks.call("on_save_checkpoint", fit, fit.module, training_state)
    fit.strategy.checkpoint_io.save_checkpoint(training_state, os.path.join(tmp, "training_state.pt"))
    with open(os.path.join(tmp, "fit_args.json"), "w") as f:
        f.write(fit.args.to_json_string())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final
