"""Converting a DeepSpeed checkpoint (``checkpoint-N/shards/``, written by :class:`DeepSpeedStrategy`) into one full
fp32 state dict with the keys of a single-device run (F-CKPT-5): ``taskfit convert CHECKPOINT OUT`` and
:func:`convert_checkpoint`. Mirrors DeepSpeed's ``zero_to_fp32.py`` (``get_fp32_state_dict_from_zero_checkpoint``)
and Lightning's ``convert_zero_checkpoint_to_fp32_state_dict``. The result loads into a single-device, DDP or
any other run with ``model.load_state_dict``.
"""

from __future__ import annotations

import os
import shutil

import torch

from taskfit.strategies.deepspeed import META_NAME, require_deepspeed


def deepspeed_fp32_state_dict(checkpoint: str) -> dict[str, torch.Tensor]:
    """The full fp32 state dict (parameters from the fp32 master copies, plus buffers) of the DeepSpeed checkpoint
    folder ``checkpoint`` (a local ``checkpoint-N``), keyed like the model saved by ``save_model``.

    The shard files are verified against the checkpoint's manifest (size and SHA-256) and checked to load with
    ``weights_only=True`` (plus DeepSpeed's own classes) first.

    Raises:
        FileNotFoundError: ``checkpoint`` is not a folder.
        ValueError: it is no complete DeepSpeed checkpoint (no manifest or no ``shards/taskfit_deepspeed.json``),
            or a shard is corrupted (``CheckpointError``) or needs arbitrary unpickling (``UnsafeCheckpointError``).
        ModuleNotFoundError: DeepSpeed is not installed (``pip install taskfit[deepspeed]``).
    """
    from taskfit.io.checkpoint_format import CheckpointReader
    from taskfit.io.checkpoint_io import TorchCheckpointIO
    from taskfit.strategies.deepspeed_files import load_engine_file

    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"Checkpoint folder {checkpoint!r} does not exist.")
    reader = CheckpointReader(TorchCheckpointIO(), checkpoint)
    if META_NAME not in reader.files:
        raise ValueError(f"{checkpoint!r} is not a DeepSpeed checkpoint (its manifest lists no {META_NAME}); "
                         "checkpoints of other strategies already hold full weights in model.safetensors.")
    meta = reader.read(META_NAME)
    if not isinstance(meta, dict) or not {"tag", "zero_stage", "prefix"} <= set(meta):
        raise ValueError(f"{os.path.join(checkpoint, META_NAME)!r} is not a taskfit DeepSpeed description.")
    # every engine file: verified against the manifest and proven loadable with weights_only=True (plus DeepSpeed's
    # own classes) before DeepSpeed's converter, which unpickles without restrictions, opens it
    engine_files = {}
    for name in reader.files:
        if name.startswith("shards/") and name.endswith(".pt"):
            engine_files[name] = load_engine_file(reader.read_bytes(name), repr(os.path.join(checkpoint, name)))
    shards = os.path.join(checkpoint, "shards")
    if meta["zero_stage"] == 0:  # no ZeRO: the engine's model file holds the full module
        states = engine_files.get(f"shards/{meta['tag']}/mp_rank_00_model_states.pt")
        if states is None:
            raise ValueError(f"{checkpoint!r} lists no shards/{meta['tag']}/mp_rank_00_model_states.pt.")
        full = {k: v.float() if v.is_floating_point() else v for k, v in states["module"].items()}
    else:
        require_deepspeed()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        full = get_fp32_state_dict_from_zero_checkpoint(shards, tag=meta["tag"])
    prefix = meta["prefix"]
    return {k[len(prefix):]: v.detach().clone().contiguous() for k, v in full.items() if k.startswith(prefix)}


def convert_checkpoint(checkpoint: str, output_dir: str) -> str:
    """Write ``output_dir/model.safetensors`` (full fp32 weights, single-device keys) and, when the checkpoint has
    one, ``config.json``; returns the path of the weights file.

    Raises:
        the errors of :func:`deepspeed_fp32_state_dict`.
    """
    from safetensors.torch import save_file

    state = deepspeed_fp32_state_dict(checkpoint)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "model.safetensors")
    save_file(state, path, metadata={"format": "pt", "converted_from": os.path.abspath(checkpoint)})
    if os.path.exists(os.path.join(checkpoint, "config.json")):
        shutil.copyfile(os.path.join(checkpoint, "config.json"), os.path.join(output_dir, "config.json"))
    return path
