"""``Engine.save`` / ``Engine.load``: the user's ``{"model": ..., "optimizer": ..., "step": ...}`` state in
taskfit's checkpoint folder format (the one ``Fit`` writes, see :mod:`taskfit.checkpoint.writer`), so a folder written
by either loads in the other (weights, optimizer and scheduler state, step, RNG).

The state dict is split by kind: one module (``model.safetensors`` + ``config.json``, or the strategy's shards),
optimizers in order of appearance (``optimizer.pt``, ``optimizer_1.pt``...), LR schedulers (``scheduler.pt``...),
and plain values (ints, tensors, dicts, objects with ``state_dict``) which go into ``training_state.pt`` next to
the loop state ``Fit`` reads (``state.global_step`` is the value of ``"step"`` or ``"global_step"``). Every
rank writes its RNG states (``rng_state_{rank}.pt``); the manifest is written last, as for ``Fit``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from taskfit.engine.wrappers import EngineModule, EngineOptimizer, unwrap_module, unwrap_optimizer

_STEP_KEYS = ("step", "global_step")


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.Optimizer, EngineOptimizer))


def _is_scheduler(obj: Any) -> bool:
    return hasattr(obj, "optimizer") and hasattr(obj, "state_dict") and hasattr(obj, "step") and not \
        _is_optimizer(obj)


def split_state(state: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Keys of ``state`` by kind: ``(modules, optimizers, schedulers, values)``.

    Raises:
        TypeError: ``state`` is not a dict with string keys.
        ValueError: more than one module (a checkpoint folder holds one model).
    """
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise TypeError(f"state must be a dict with str keys, e.g. {{'model': model, 'optimizer': optimizer, "
                        f"'step': step}}; got {type(state).__name__}.")
    modules = [k for k, v in state.items() if isinstance(v, (nn.Module, EngineModule))]
    optimizers = [k for k, v in state.items() if _is_optimizer(v)]
    schedulers = [k for k, v in state.items() if k not in optimizers and _is_scheduler(v)]
    if len(modules) > 1:
        raise ValueError(f"A checkpoint holds one model, but state has {len(modules)} modules {modules}; save them "
                         "to separate folders, or wrap them in one nn.Module.")
    values = [k for k in state if k not in modules and k not in optimizers and k not in schedulers]
    return modules, optimizers, schedulers, values


def _value_state(value: Any) -> Any:
    return value.state_dict() if hasattr(value, "state_dict") and callable(value.state_dict) else value


def save(strategy: Any, options: Any, path: str, state: dict[str, Any], record: str) -> str:
    """Write ``state`` to the checkpoint folder ``path`` (replacing a complete one there) through
    ``strategy.save_checkpoint`` (which adds the module's and optimizers' states: shards or full files). Every
    process calls it.

    Args:
        strategy (Strategy): the Engine's strategy.
        options (StrategyOptions): its options (``ddp_timeout``: the save's barrier timeout in seconds;
            ``save_safetensors``: the full-weight file's format).
        path (str): the folder (local or fsspec URL).
        state (dict[str, Any]): ``{"model": ..., "optimizer": ..., "step": ..., ...}``.
        record (str): the options as JSON text (``fit_args.json``).

    Returns:
        str: ``path``.

    Raises:
        TypeError, ValueError: see :func:`split_state`; ValueError also for several optimizers under a strategy
            that writes its optimizer state as shards.
    """
    from taskfit.strategies.checkpointing import FolderPlan, manifest_header

    modules, optimizers, schedulers, values = split_state(state)
    step = next((int(state[k]) for k in _STEP_KEYS if k in values and _is_int_like(state[k])), 0)
    module = unwrap_module(state[modules[0]]) if modules else None
    plan = FolderPlan.default(strategy, path)
    plan.manifest = manifest_header(step, strategy.world_size)
    plan.timeout = float(options.ddp_timeout or 1800)
    if options.save_safetensors is False:
        plan.weights_name = "pytorch_model.bin"
    files = _files(strategy, record, state, step, module, (modules, optimizers, schedulers, values)) \
        if plan.writer else {}
    from taskfit.seed import rng_states

    files[f"rng_state_{strategy.global_rank}.pt"] = rng_states(strategy.accelerator)
    strategy.save_checkpoint(path, files, module, [unwrap_optimizer(state[k]) for k in optimizers], plan=plan)
    strategy.barrier("engine-save-done")
    return path


def _files(strategy: Any, record: str, state: dict[str, Any], step: int, module: nn.Module | None,
           kinds: tuple[list[str], list[str], list[str], list[str]]) -> dict[str, Any]:
    """The writing rank's files besides the RNG and the model/optimizer states: ``config.json``, schedulers, the
    loop state with the plain values (``training_state.pt``), ``trainer_state.json`` and ``fit_args.json``."""
    from taskfit.__about__ import __version__
    from taskfit.loops.state import FitControl, FitState
    from taskfit.strategies.checkpointing import exportable_model, states_on_cpu

    modules, optimizers, schedulers, values = kinds
    files: dict[str, Any] = {}
    if module is not None:
        exported = exportable_model(module)
        config = getattr(exported, "config", None)
        files["config.json"] = config.to_json_string() if hasattr(config, "to_json_string") else {
            "class": f"{type(exported).__module__}.{type(exported).__qualname__}",
            "num_parameters": sum(p.numel() for p in exported.parameters()), "taskfit_version": __version__}
    for i, key in enumerate(schedulers):
        files["scheduler.pt" if i == 0 else f"scheduler_{i}.pt"] = state[key].state_dict()
    fit_state = FitState(global_step=step)
    files["training_state.pt"] = {
        "version": 2, "state": fit_state.flat_dict(), "control": FitControl().state_dict(),
        "precision": strategy.precision.state_dict(), "callbacks": {}, "results": {},
        "engine": {"modules": modules, "optimizers": optimizers, "schedulers": schedulers,
                   "values": states_on_cpu(strategy, {k: _value_state(state[k]) for k in values})},
        "taskfit_version": __version__}
    files["trainer_state.json"] = fit_state.flat_dict()
    files["fit_args.json"] = record
    return files


def _is_int_like(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point()


def load(strategy: Any, path: str, state: dict[str, Any], strict: bool = True,
         weights_only: bool = True) -> dict[str, Any]:
    """Restore the checkpoint folder ``path`` (written by ``Engine.save`` or by ``Fit``) into ``state``: the module
    and optimizers/schedulers in place (through the strategy: shards or full files, the same reader ``Fit``
    resumes with), plain values by key in ``state`` (objects with ``load_state_dict`` in place), the precision
    plugin's scaler and this process's RNG states. Returns the saved values ``state`` did not ask for (for a
    ``Fit`` checkpoint: ``global_step`` and ``epoch``).

    Raises:
        CheckpointError: missing, corrupted or incomplete files (names the file).
        KeyError: with ``strict``, a value key of ``state`` that the checkpoint lacks (names the keys it has).
        UnsafeCheckpointError: a file needs full unpickling and ``weights_only`` is True.
    """
    from taskfit.checkpoint.resume import read_checkpoint
    from taskfit.io.checkpoint_format import CheckpointReader
    from taskfit.seed import set_rng_states

    modules, optimizers, schedulers, values = split_state(state)
    io = strategy.checkpoint_io
    io.wait()
    reader = CheckpointReader(io, path, weights_only=weights_only)  # each file read once, verified
    manifest = reader.manifest
    full = not manifest.get("save_only_model")
    if modules:
        module = unwrap_module(state[modules[0]])
        loaded = read_checkpoint(strategy, path, module, [unwrap_optimizer(state[k]) for k in optimizers],
                                 [state[k] for k in schedulers], weights_only=weights_only, full=full, reader=reader)
        ts = loaded.get("training_state")
    elif full:
        ts = reader.read("training_state.pt")
        rng_name = f"rng_state_{strategy.global_rank}.pt"
        ts["rng"] = reader.read(rng_name) if rng_name in manifest["files"] else None
    else:
        ts = None
    saved: dict[str, Any] = {}
    if ts is not None:
        engine = ts.get("engine")
        if engine is not None:
            saved = dict(engine.get("values", {}))
        else:  # a Fit checkpoint: its loop position
            saved = {"global_step": ts["state"].get("global_step", 0), "epoch": ts["state"].get("epoch", 0.0)}
        if ts.get("precision"):
            strategy.precision.load_state_dict(ts["precision"])
        if ts.get("rng") is not None:
            set_rng_states(ts["rng"], strategy.accelerator)
    missing = [k for k in values if k not in saved]
    if strict and missing:
        raise KeyError(f"{path!r} has no saved value for {missing}; it holds {sorted(saved)}. Pass strict=False to "
                       "load the rest.")
    for k in values:
        if k not in saved:
            continue
        if hasattr(state[k], "load_state_dict") and callable(state[k].load_state_dict):
            state[k].load_state_dict(saved[k])
        else:
            state[k] = saved[k]
    return {k: v for k, v in saved.items() if k not in state}
