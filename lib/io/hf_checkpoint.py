"""Checkpoint interop with ``transformers.Trainer``, both ways (single process).

Reading: a ``checkpoint-N`` folder written by ``transformers.Trainer`` has no taskfit manifest. It is recognised by
``trainer_state.json`` plus model weights and none of taskfit's own files, and read through
:class:`HFCheckpointReader`, a :class:`~taskfit.io.checkpoint_format.CheckpointReader` whose manifest is built from
the folder's listing: the model weights, ``optimizer.pt`` and ``scheduler.pt`` are read as they are (HF writes
them with ``torch.save`` of plain state dicts, as taskfit does), and the entries taskfit's resume path asks for
are made from HF's files: ``training_state.pt`` from ``trainer_state.json`` (step, epoch, log history, best metric,
callback states), ``rng_state_{rank}.pt`` from HF's ``rng_state.pth`` (``rng_state_{rank}.pth`` for several
processes). So a resume from an HF folder is the ordinary resume (:func:`taskfit.checkpoint.resume.restore`) with another
reader. HF's files carry no hashes, so they are not verified; every file is still loaded with
``torch.load(weights_only=True)`` (HF's RNG file needs numpy's array and dtype classes, allowed for that file
only), and ``training_args.bin`` (a full pickle) is never read.

Writing: a single-process taskfit checkpoint holds every file ``transformers.Trainer`` reads to resume; its own
``model.safetensors``, ``optimizer.pt``, ``scheduler.pt`` and ``trainer_state.json`` already are HF's files, and
:func:`hf_rng_file` adds HF's ``rng_state.pth`` (a few kilobytes).

Mirrors ``transformers.Trainer._load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_rng_state`` and
``_save_rng_state`` (transformers 5.x).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from typing import Any, Iterator

import torch

from taskfit.io.checkpoint_format import (
    MANIFEST_NAME, WEIGHTS_NAME, WEIGHTS_NAME_PT, CheckpointError, CheckpointReader,
)
from taskfit.io.checkpoint_io import CheckpointIO, join
from taskfit.io.peft_files import ADAPTER_FILES, ADAPTER_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME_PT

log = logging.getLogger("taskfit")

#: the ``format`` of the manifest :class:`HFCheckpointReader` builds for a transformers checkpoint
HF_FORMAT = "transformers-trainer"
HF_STATE_NAME = "trainer_state.json"
HF_RNG_NAME = "rng_state.pth"
_HF_RNG_RE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
#: files only a taskfit checkpoint has: a folder with one of them is a (maybe incomplete) taskfit checkpoint
_TASKFIT_ONLY = (MANIFEST_NAME, "fit_args.json", "training_state.pt")
_TASKFIT_RNG_RE = re.compile(r"^rng_state_\d+\.pt$")  # taskfit writes these first; HF's end in .pth
#: the files of a transformers checkpoint taskfit reads as they are
_HF_FILES = (WEIGHTS_NAME, WEIGHTS_NAME_PT, "optimizer.pt", "scheduler.pt", HF_STATE_NAME, "config.json",
             *ADAPTER_FILES)  # a PEFT model's checkpoint holds its adapter (PEFT's layout) instead of full weights


def _listing(io: CheckpointIO, folder: str) -> list[str]:
    try:
        return list(io.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


def is_hf_checkpoint(io: CheckpointIO, folder: str) -> bool:
    """Whether ``folder`` is a checkpoint written by ``transformers.Trainer``: it holds ``trainer_state.json`` and
    full model weights (``model.safetensors`` or ``pytorch_model.bin``) or a PEFT model's adapter weights
    (``adapter_model.safetensors`` / ``adapter_model.bin``), and none of taskfit's own files (an interrupted
    taskfit save lacks only its manifest, and stays refused as incomplete)."""
    names = set(_listing(io, folder))
    weights = {WEIGHTS_NAME, WEIGHTS_NAME_PT, ADAPTER_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME_PT}
    return (HF_STATE_NAME in names and bool(names & weights)
            and not names & set(_TASKFIT_ONLY) and not any(_TASKFIT_RNG_RE.match(n) for n in names))


def _adapter_subfiles(io: CheckpointIO, folder: str) -> list[str]:
    """``{adapter}/adapter_model.safetensors``-style names: the files of every PEFT adapter but the default one,
    which PEFT (and so ``transformers.Trainer``) saves in a sub-folder named after the adapter."""
    out = []
    for name in _listing(io, folder):
        if "." not in name:  # file names have a suffix; adapter names rarely do
            out += [f"{name}/{n}" for n in _listing(io, join(folder, name)) if n in ADAPTER_FILES]
    return out


@contextlib.contextmanager
def numpy_rng_globals() -> Iterator[None]:
    """Allow, inside the block, exactly the numpy classes HF's ``rng_state.pth`` pickles (the MT19937 key array:
    ``ndarray``, its ``_reconstruct``, ``dtype`` and the ``uint32`` dtype class) for ``torch.load(weights_only=
    True)``; mirrors ``transformers.trainer_pt_utils.safe_globals``."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        yield


class HFCheckpointReader(CheckpointReader):
    """Reads a ``transformers.Trainer`` checkpoint folder through the interface of
    :class:`~taskfit.io.checkpoint_format.CheckpointReader` (see the module docstring for the entries it makes).

    Args:
        io (CheckpointIO): the plugin to read through.
        folder (str): the ``checkpoint-N`` folder HF wrote.
        weights_only (bool): refuse files that need arbitrary unpickling (default).

    Raises:
        CheckpointError: ``trainer_state.json`` is missing or not HF's trainer state.
    """

    def __init__(self, io: CheckpointIO, folder: str, weights_only: bool = True) -> None:
        names = _listing(io, folder)
        self.io, self.folder, self.weights_only = io, folder, weights_only
        self.hf_state = self._trainer_state()
        rng = {int(m.group(1) or 0): n for n in names if (m := _HF_RNG_RE.match(n))}
        subfiles = _adapter_subfiles(io, folder)
        files = {n: {"size": -1, "sha256": ""} for n in [*names, *subfiles] if n in _HF_FILES or n in subfiles}
        virtual = {"fit_args.json", "training_state.pt"} | {f"rng_state_{r}.pt" for r in rng}
        files.update({n: {"size": -1, "sha256": ""} for n in virtual})
        self._rng_files = rng
        self.manifest = {"format": HF_FORMAT, "version": 0, "global_step": self.hf_state["global_step"],
                         "world_size": max(len(rng), 1), "save_only_model": "optimizer.pt" not in names,
                         "files": dict(sorted(files.items()))}
        self._lock = threading.Lock()

    def _trainer_state(self) -> dict[str, Any]:
        path = join(self.folder, HF_STATE_NAME)
        try:
            state = json.loads(self.io.read_bytes(path).decode("utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path!r} is missing: not a transformers checkpoint.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path!r} is not valid JSON: {exc}") from None
        if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
            raise CheckpointError(f"{path!r} is not a transformers TrainerState (no integer global_step).")
        return state

    def read_bytes(self, name: str) -> bytes:
        """The bytes of HF's file ``name`` (unverified: HF records no hashes).

        Raises:
            CheckpointError: the file is missing.
        """
        path = join(self.folder, name)
        try:
            return self.io.read_bytes(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise CheckpointError(f"Checkpoint file {path!r} is missing.") from None

    def read(self, name: str, weights_only: bool | None = None, map_location: Any = "cpu") -> Any:
        """HF's file ``name`` deserialised, or one of the entries made from HF's files (``fit_args.json``,
        ``training_state.pt``, ``rng_state_{rank}.pt``).

        Raises:
            CheckpointError: a missing or unreadable file. UnsafeCheckpointError: it needs full unpickling and
                ``weights_only`` is True.
        """
        if name == "fit_args.json":
            # the saved arguments a resume compares with (HF's train_batch_size is per device on one process)
            return {"per_device_train_batch_size": self.hf_state.get("train_batch_size")}
        if name == "training_state.pt":
            return training_state_from_hf(self.hf_state)
        m = re.match(r"^rng_state_(\d+)\.pt$", name)
        if m and int(m.group(1)) in self._rng_files:
            hf_name = self._rng_files[int(m.group(1))]
            with numpy_rng_globals():
                states = super().read(hf_name, weights_only, map_location)
            return rng_from_hf(states, join(self.folder, hf_name))
        return super().read(name, weights_only, map_location)


def training_state_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """A :class:`~taskfit.loops.state.TrainingState` dict from HF's ``trainer_state.json``: the step, epoch, log
    history, best metric and checkpoint, FLOPs, tokens seen and callback states. The position in the epoch is
    placed by :func:`place_hf_position` (it depends on the resuming run's data); there are no running loss sums
    (the first logged loss after the resume averages the steps since the resume, as under HF)."""
    keys = ("epoch", "global_step", "log_history", "best_metric", "best_model_checkpoint", "best_global_step",
            "total_flos", "num_input_tokens_seen", "trial_name", "is_hyper_param_search")
    state = {k: hf[k] for k in keys if k in hf}
    callbacks = {k: (v[0] if isinstance(v, list) and v else v)
                 for k, v in (hf.get("stateful_callbacks") or {}).items() if k != "TrainerControl"}
    state["stateful_callbacks"] = dict(hf.get("stateful_callbacks") or {})
    control = ((hf.get("stateful_callbacks") or {}).get("TrainerControl") or {}).get("args") or {}
    return {"version": 2, "state": state, "control": dict(control), "loop": {}, "precision": {},
            "callbacks": callbacks, "results": {}, "hf_checkpoint": True}


def place_hf_position(state: Any, batches_per_epoch: int | None, accumulation: int) -> None:
    """Set ``state.current_epoch`` and ``state.batch_in_epoch`` of a run resumed from an HF checkpoint the way
    ``transformers.Trainer._init_training_state`` does: ``global_step // update steps per epoch`` epochs are done
    and ``(global_step % update steps per epoch) * gradient_accumulation_steps`` micro-batches of the next one."""
    if not batches_per_epoch:
        state.current_epoch, state.batch_in_epoch = 0, 0
        return
    per_epoch = max(batches_per_epoch // accumulation + int(batches_per_epoch % accumulation > 0), 1)
    state.current_epoch = state.global_step // per_epoch
    state.batch_in_epoch = (state.global_step % per_epoch) * accumulation


def rng_from_hf(states: Any, path: str) -> dict[str, Any]:
    """taskfit's RNG dict (:func:`taskfit.seed.rng_states`) from HF's ``rng_state.pth`` contents.

    Raises:
        CheckpointError: the file lacks HF's ``python``/``numpy``/``cpu`` entries.
    """
    if not isinstance(states, dict) or not {"python", "numpy", "cpu"} <= set(states):
        raise CheckpointError(f"{path!r} is not HF's RNG state (python, numpy and cpu entries).")
    name, keys, pos, has_gauss, cached = states["numpy"]
    out: dict[str, Any] = {"python": states["python"],
                           "numpy": (name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
                           "torch": states["cpu"]}
    cuda = states.get("cuda")
    if isinstance(cuda, torch.Tensor):  # HF: the current device's state on one process; taskfit keeps all devices
        out["cuda"] = [cuda]
    elif isinstance(cuda, (list, tuple)):
        out["cuda"] = list(cuda)
    return out


def hf_rng_file(rng: dict[str, Any], device_index: int | None = None) -> dict[str, Any]:
    """HF's ``rng_state.pth`` contents (``python``, ``numpy``, ``cpu`` and, after CUDA was used, ``cuda``: the
    current device's state, as HF saves it on one process) from taskfit's RNG dict. The numpy key is a list of
    ints, so ``torch.load(weights_only=True)`` reads the file without allowing numpy classes; HF's
    ``np.random.set_state`` accepts it."""
    out = {"python": rng["python"], "numpy": tuple(rng["numpy"]), "cpu": rng["torch"]}
    cuda = rng.get("cuda")
    if cuda:
        out["cuda"] = cuda[device_index or 0]  # the run's device (the strategy's root device index)
    return out


def adopt_message(folder: str, hf_state: dict[str, Any]) -> str:
    return (f"Adopting the transformers.Trainer checkpoint {folder} (global_step {hf_state.get('global_step')}, "
            f"epoch {hf_state.get('epoch')}): weights, optimizer, scheduler, RNG and trainer state are read from "
            "HF's files.")


def exportable(callback: Any) -> bool:
    """True for an HF ``ExportableState`` callback: one with a ``state()`` method returning its ``args`` and
    ``attributes`` (HF's ``EarlyStoppingCallback``, a user's ``TrainerCallback`` + ``ExportableState``)."""
    return callable(getattr(callback, "state", None)) and not isinstance(callback, type)


def export_callback_states(callbacks: list[Any], control: Any = None) -> dict[str, Any]:
    """``stateful_callbacks`` as ``transformers.Trainer._save_checkpoint`` writes it: ``{class name: state()}`` of
    every :func:`exportable` callback (a list, in order, for several of one class) and, with ``control``,
    ``TrainerControl``'s flags."""
    states: dict[str, list[Any]] = {}
    for cb in callbacks:
        if exportable(cb):
            states.setdefault(type(cb).__name__, []).append(cb.state())
    out: dict[str, Any] = {k: v[0] if len(v) == 1 else v for k, v in states.items()}
    if control is not None:
        flags = control.state_dict() if hasattr(control, "state_dict") else {}
        out["TrainerControl"] = {"args": dict(flags), "attributes": {}}
    return out


def restore_callback_states(callbacks: list[Any], saved: dict[str, Any]) -> list[str]:
    """Restore :func:`export_callback_states` output into ``callbacks`` as HF's ``Trainer._load_callback_state``
    does: per saved class name, the callbacks of that class in order get their constructor ``args`` (the
    callback is re-initialised with them, in place, so the run's hook lists keep it) and then their
    ``attributes``. ``TrainerControl`` is left to the caller (the control flags are restored with the state).

    Returns:
        list[str]: the saved class names no callback of the run matches (HF warns about them).
    """
    missing = []
    for name, data in (saved or {}).items():
        if name == "TrainerControl":
            continue
        same = [cb for cb in callbacks if type(cb).__name__ == name and exportable(cb)]
        if not same:
            missing.append(name)
            continue
        for cb, state in zip(same, data if isinstance(data, list) else [data]):
            type(cb).__init__(cb, **(state.get("args") or {}))
            for k, v in (state.get("attributes") or {}).items():
                setattr(cb, k, v)
    return missing


def hf_trainer_state(state: dict[str, Any], control: Any, callbacks: list[Any]) -> dict[str, Any]:
    """``trainer_state.json`` contents with ``stateful_callbacks`` as ``transformers.Trainer`` writes them: the
    state of every HF ``ExportableState`` callback (a list for several of one class) and of ``TrainerControl``
    (HF's ``_save_checkpoint`` looks each of them up after a resume)."""
    return {**state, "stateful_callbacks": export_callback_states(callbacks, control)}


# ---- parameter groups ----------------------------------------------------------------------------------------
#: scheduler state entries that hold one value per parameter group
_PER_GROUP_KEYS = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs")


def hf_missing_groups(optimizer: Any, model: Any, weight_decay: float,
                      decay_names: set[str]) -> list[tuple[int, float]]:
    """The empty parameter groups HF's optimizer would have and taskfit's does not: HF ``create_optimizer`` always
    makes two groups (decay, then no-decay with ``weight_decay=0``) and keeps an empty one; taskfit drops it. Returns
    ``[(index, weight_decay)]`` to insert, empty when ``optimizer`` is not one group that is exactly HF's decay or
    no-decay group of ``model`` (a user's optimizer is left as it is). ``decay_names`` are the parameter names HF
    decays (``get_decay_parameter_names``)."""
    if optimizer is None or model is None or len(optimizer.param_groups) != 1:
        return []
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n in decay_names]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and n not in decay_names]
    group = optimizer.param_groups[0]
    ids = [id(p) for p in group["params"]]
    if not no_decay and ids == [id(p) for p in decay] and group.get("weight_decay") == weight_decay:
        return [(1, 0.0)]
    if not decay and ids == [id(p) for p in no_decay] and group.get("weight_decay", 0.0) == 0.0:
        return [(0, weight_decay)]
    return []


def pad_groups(opt_state: dict[str, Any], sched_state: dict[str, Any] | None,
               missing: list[tuple[int, float]]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Optimizer and scheduler state dicts with the empty groups ``missing`` (:func:`hf_missing_groups`) inserted,
    so that HF's two-group optimizer and schedule load them. An empty group holds no parameter, so the parameter
    indices and the per-parameter state stay as they are."""
    groups = list(opt_state["param_groups"])
    sched = dict(sched_state) if sched_state is not None else None
    for index, wd in missing:
        groups.insert(index, {**groups[0], "params": [], "weight_decay": wd})
        if sched is not None:
            for key in _PER_GROUP_KEYS:
                if isinstance(sched.get(key), list) and sched[key]:
                    sched[key] = sched[key][:index] + [sched[key][0]] + sched[key][index:]
    return {**opt_state, "param_groups": groups}, sched


def drop_empty_groups(opt_state: Any, n_groups: int) -> tuple[Any, list[int] | None]:
    """``opt_state`` fitted to an optimizer with ``n_groups`` groups by dropping saved groups without parameters
    (HF keeps an empty decay or no-decay group, taskfit does not); returns the state and the kept group indices
    (None when nothing was dropped). A state that does not fit either way is returned unchanged (the optimizer's
    own ``load_state_dict`` then names the mismatch)."""
    if not isinstance(opt_state, dict) or not isinstance(opt_state.get("param_groups"), list):
        return opt_state, None
    groups = opt_state["param_groups"]
    if len(groups) == n_groups:
        return opt_state, None
    keep = [i for i, g in enumerate(groups) if g.get("params")]
    if len(keep) != n_groups:
        return opt_state, None
    return {**opt_state, "param_groups": [groups[i] for i in keep]}, keep


def select_scheduler_groups(sched_state: Any, keep: list[int] | None, n_saved: int) -> Any:
    """The scheduler state of the groups ``keep`` (:func:`drop_empty_groups`) out of ``n_saved``."""
    if keep is None or not isinstance(sched_state, dict):
        return sched_state
    out = dict(sched_state)
    for key in _PER_GROUP_KEYS:
        if isinstance(out.get(key), list) and len(out[key]) == n_saved:
            out[key] = [out[key][i] for i in keep]
    return out


__all__ = ["HFCheckpointReader", "HF_FORMAT", "HF_RNG_NAME", "adopt_message", "drop_empty_groups", "hf_missing_groups",
           "hf_rng_file", "hf_trainer_state", "is_hf_checkpoint", "numpy_rng_globals", "pad_groups", "place_hf_position", "rng_from_hf",
           "select_scheduler_groups", "training_state_from_hf"]
