"""Hostile and corrupted checkpoint files for the reliability tests: a pickle whose unpickling would create a
marker file, and rewriting a checkpoint file together with its manifest entry (so only the content is wrong);
``default_adamw`` builds the optimizer taskfit's default run has, to load such checkpoints into by hand."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path

import torch


class Evil:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears iff arbitrary code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def evil_torch_file(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"state": {}, "payload": Evil(marker)}, buf)
    return buf.getvalue()


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(Evil(marker))


def replace_file(checkpoint: Path, name: str, data: bytes, add: bool = False) -> None:
    """Write ``data`` as ``checkpoint/name`` and make the manifest entry match (``add``: a new entry)."""
    path = checkpoint / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert add or name in manifest["files"], name
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_path.write_text(json.dumps(manifest))


def edit_manifest(checkpoint: Path, fn) -> None:
    path = checkpoint / "manifest.json"
    manifest = json.loads(path.read_text())
    fn(manifest)
    path.write_text(json.dumps(manifest))


def default_adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW over ``model`` with the two parameter groups taskfit's default optimizer has (weight decay / none)."""
    from taskfit.optim.optimizers import get_decay_parameter_names

    decay = set(get_decay_parameter_names(model))
    named = list(model.named_parameters())
    return torch.optim.AdamW([{"params": [p for n, p in named if n in decay]},
                              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}])
