"""Checkpoints on the command line: ``taskfit validate|test|predict --ckpt_path PATH|best|last`` (which checkpoint
to score, mirrors Lightning's ``ckpt_path``; resolved by :func:`taskfit.fit.ckpt_path.resolve_ckpt_path`, as
``Fit.validate(ckpt_path=...)`` does) and ``taskfit convert CHECKPOINT OUT`` (full weights out of a
sharded FSDP or DeepSpeed checkpoint)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any


def load_checkpoint_weights(fit: Any, module: Any, path: str) -> None:
    """Load the weights of checkpoint ``path`` into ``module`` through ``fit`` (full weights, or the shards of an
    FSDP / DeepSpeed checkpoint gathered to full weights).

    Raises:
        CheckpointError: the weights do not match the module or are missing.
    """
    from taskfit.checkpoint.writer import WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, read_manifest
    from taskfit.checkpoint.resume import load_model_weights

    io = fit.strategy.checkpoint_io
    manifest = read_manifest(io, path)
    if WEIGHTS_NAME in manifest["files"] or WEIGHTS_NAME_PT in manifest["files"]:
        load_model_weights(fit.strategy, module, path, manifest)
        return
    state = full_weights(path)
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{path!r} does not match {type(module).__name__}: missing keys "
                              f"{result.missing_keys[:5]}, unexpected keys {result.unexpected_keys[:5]}.")


def full_weights(checkpoint: str) -> dict[str, Any]:
    """Full single-device weights of a sharded checkpoint folder: FSDP (``shards/`` written by
    ``torch.distributed.checkpoint``) or DeepSpeed (``shards/taskfit_deepspeed.json``).

    Raises:
        FileNotFoundError: ``checkpoint`` is not a folder. ValueError: it holds neither kind of shards.
    """
    from taskfit.io.checkpoint_format import CheckpointReader
    from taskfit.io.checkpoint_io import TorchCheckpointIO
    from taskfit.strategies.checkpoint_shards import (
        METADATA_NAME, SHARDS_DIR, read_full_state_dict, verified_shard_bytes,
    )

    if not os.path.isdir(checkpoint):
        raise FileNotFoundError(f"Checkpoint folder {checkpoint!r} does not exist.")
    if os.path.isfile(os.path.join(checkpoint, SHARDS_DIR, METADATA_NAME)):  # FSDP: a DCP shard set
        # every shard is checked against the manifest and unpickled safely
        reader = CheckpointReader(TorchCheckpointIO(), checkpoint)
        return read_full_state_dict(checkpoint, verified_shard_bytes(reader))["model"]
    from taskfit.strategies.deepspeed_convert import deepspeed_fp32_state_dict

    return deepspeed_fp32_state_dict(checkpoint)


def convert_main(argv: Sequence[str] | None = None) -> int:
    """``taskfit convert CHECKPOINT OUT``: write ``OUT/model.safetensors`` (full weights, single-device keys) from
    an FSDP sharded or DeepSpeed checkpoint (and, for FSDP, ``OUT/optimizer.pt``); prints the weights file.
    Status 2 with the reason on stderr when the folder holds no shards (a checkpoint of another strategy already
    has ``model.safetensors``)."""
    parser = argparse.ArgumentParser(prog="taskfit convert", description="Convert a sharded FSDP or DeepSpeed "
                                     "checkpoint (checkpoint-N with shards/) into full weights: OUT/model.safetensors.")
    parser.add_argument("checkpoint", help="the checkpoint-N folder")
    parser.add_argument("output_dir", help="folder for model.safetensors")
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    from taskfit.strategies.checkpoint_shards import METADATA_NAME, SHARDS_DIR

    from taskfit.checkpoint.writer import WEIGHTS_NAME, WEIGHTS_NAME_PT

    full = [name for name in (WEIGHTS_NAME, WEIGHTS_NAME_PT)
            if os.path.isfile(os.path.join(ns.checkpoint, name))]
    if full:  # DDP, single-device, DP: the weights are whole already
        print(f"taskfit convert: error: {ns.checkpoint!r} already holds full weights ({full[0]}), as every checkpoint "
              "of an unsharded strategy (ddp, single device) does: nothing to convert. Score it with --ckpt_path "
              "or load that file directly.", file=sys.stderr)
        return 2
    try:
        if os.path.isfile(os.path.join(ns.checkpoint, SHARDS_DIR, METADATA_NAME)):
            from taskfit.strategies.checkpoint_shards import convert_checkpoint

            convert_checkpoint(ns.checkpoint, ns.output_dir)
            path = os.path.join(ns.output_dir, "model.safetensors")
        else:
            from taskfit.strategies.deepspeed_convert import convert_checkpoint as deepspeed_convert

            path = deepspeed_convert(ns.checkpoint, ns.output_dir)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as err:
        print(f"taskfit convert: error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0
