"""Hyperparameters as Lightning records them: ``save_hyperparameters`` / ``hparams`` (:class:`HyperparametersMixin`,
shared by ``TaskModule`` and ``DataModule``) and the constructor arguments ``load_from_checkpoint`` rebuilds a module
from (:func:`rebuild_kwargs`)."""

from __future__ import annotations

import copy
import inspect
import pickle
import types
import warnings
from argparse import Namespace
from collections.abc import Mapping, MutableMapping
from dataclasses import fields, is_dataclass
from typing import Any

import torch

__all__ = ["AttributeDict", "HyperparametersMixin", "drop_unpicklable", "is_picklable", "rebuild_kwargs"]

# what a single non-name argument of save_hyperparameters may not be (Lightning's _PRIMITIVE_TYPES)
_PRIMITIVES = (bool, int, float, str)


class AttributeDict(dict):
    """A dict whose keys read as attributes (``hparams.lr``), as Lightning's ``AttributeDict``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(f"hparams has no {key!r}; it holds {sorted(self)}.") from exc

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]


def is_picklable(obj: object) -> bool:
    """True when ``pickle.dumps(obj)`` works (mirrors ``lightning.pytorch.utilities.is_picklable``)."""
    try:
        pickle.dumps(obj)
        return True
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False


def drop_unpicklable(hparams: MutableMapping) -> None:
    """Remove the values of ``hparams`` that cannot be pickled, with Lightning's ``UserWarning`` for each (what
    Lightning's ``Trainer.fit`` does to the module's ``hparams`` before training: ``clean_namespace``)."""
    for key in [k for k, v in hparams.items() if not is_picklable(v)]:
        warnings.warn(f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this "
                      f"warning by setting `self.save_hyperparameters(ignore=['{key}'])`.", UserWarning, stacklevel=3)
        del hparams[key]


def _init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names of ``self``, ``*args`` and ``**kwargs`` in ``cls.__init__`` (whatever the author called them)."""
    params = list(inspect.signature(cls.__init__).parameters.values())
    var_args = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    var_kwargs = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    return params[0].name, var_args, var_kwargs


def _frame_init_args(frame: types.FrameType) -> tuple[Any, dict[str, Any]] | None:
    """``(self, arguments)`` of the ``__init__`` running in ``frame`` (its signature's names, ``**kwargs``
    flattened, ``self`` and ``*args`` left out), None when ``frame`` runs no ``__init__`` that uses ``super()``
    (Lightning reads the ``__class__`` cell to find the class)."""
    local = frame.f_locals
    if frame.f_code.co_name != "__init__" or "__class__" not in local:
        return None
    cls = local["__class__"]
    self_name, var_args, var_kwargs = _init_keys(cls)
    names = inspect.signature(cls.__init__).parameters
    out = {k: local[k] for k in names if k in local and k not in (self_name, var_args, var_kwargs)}
    if var_kwargs:
        out.update(local.get(var_kwargs) or {})
    return local.get(self_name), out


def collect_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The constructor arguments along the chain of ``__init__`` calls that ``frame`` belongs to, outermost (most
    derived class) last, so a subclass's value wins: Lightning's ``collect_init_args``. The walk starts at the
    first ``__init__`` of a :class:`HyperparametersMixin` and stops at the first frame above it that is not one (a
    plain object holding the module, a factory function)."""
    chain: list[dict[str, Any]] = []
    inside = False
    while frame is not None and frame.f_back is not None:
        found = _frame_init_args(frame)
        if found is not None and isinstance(found[0], HyperparametersMixin):
            chain.append(found[1])
            inside = True
        elif inside:
            break
        frame = frame.f_back
    out: dict[str, Any] = {}
    for args in chain:
        out.update(args)
    return out


def _hparams_dict(value: Any) -> Any:
    """One config object as ``hparams``: a Namespace's or dict's items in an :class:`AttributeDict`, any other
    mapping (an OmegaConf ``DictConfig``) as it is (Lightning's ``_to_hparams_dict``)."""
    if isinstance(value, Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return AttributeDict(value)
    if isinstance(value, _PRIMITIVES):
        raise ValueError(f"Primitives {_PRIMITIVES} are not allowed.")  # noqa: TRY004 - Lightning raises ValueError
    if not isinstance(value, MutableMapping):
        raise ValueError(f"Unsupported config type of {type(value)}.")  # noqa: TRY004 - as Lightning
    return value


class HyperparametersMixin:
    """``save_hyperparameters``/``hparams`` (Lightning's ``HyperparametersMixin``), shared by ``TaskModule`` and
    ``DataModule``. The ``CHECKPOINT_HYPER_PARAMS_*`` names are the keys Lightning's checkpoints use (a taskfit
    checkpoint's ``config.json`` holds ``hyper_parameters`` and ``hparams_name``)."""

    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    def save_hyperparameters(self, *args: Any, ignore: str | list[str] | tuple[str, ...] | None = None,
                             frame: types.FrameType | None = None, logger: bool = True) -> None:
        """Record the constructor arguments in :attr:`hparams` (mirrors Lightning's ``save_hyperparameters``).

        Called in ``__init__`` without arguments, the arguments of every ``__init__`` in the chain of ``super()``
        calls are saved (a subclass's value wins; a dataclass module saves its ``init`` fields); with names, only
        those; with one dict, ``argparse.Namespace`` or other mapping, its items. ``ignore`` drops names, also ones
        a base class saved earlier. An ``nn.Module`` value warns (its weights are in the checkpoint already).
        Checkpoints store the JSON-serialisable values, so ``load_from_checkpoint`` rebuilds the module without
        constructor arguments.

        Args:
            *args (str | dict | Namespace): names of ``__init__`` arguments, or one config object.
            ignore (str | list[str] | tuple[str, ...] | None): names left out.
            frame (FrameType | None): the ``__init__`` frame to read (default: the caller's).
            logger (bool): False keeps the values away from the loggers' ``log_hyperparams``.

        Raises:
            ValueError: one argument that is a bool, int, float or str value rather than a name or a config
                (Lightning's "Primitives ... are not allowed."); a name that is not an ``__init__`` argument.
        """
        object.__setattr__(self, "_log_hyperparams", logger)
        if len(args) == 1 and not isinstance(args[0], str) and not args[0]:
            return  # an empty config: nothing to save (Lightning)
        frame = frame or inspect.currentframe().f_back
        if is_dataclass(self):
            init = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        else:
            init = collect_init_args(frame)
        ignored = [ignore] if isinstance(ignore, str) else [i for i in (ignore or ()) if isinstance(i, str)]
        init = {k: v for k, v in init.items() if k not in ignored}
        configs = [a for a in args if not isinstance(a, str)]
        if not args:
            values, name = init, ("kwargs" if init else None)
        elif len(configs) == 1:
            values = configs[0]
            name = next((k for k, v in init.items() if _equal(v, values)), None)
        else:
            unknown = [a for a in args if isinstance(a, str) and a not in init]
            if unknown:
                raise ValueError(f"save_hyperparameters got {unknown}, which are not __init__ arguments; "
                                 f"choose from {sorted(init)}.")
            values, name = {a: init[a] for a in args if isinstance(a, str)}, "kwargs"
        object.__setattr__(self, "_hparams_name", name)
        self._set_hparams(values)
        for key in ignored:  # a subclass may drop what its base class saved
            self.hparams.pop(key, None)
        for key, value in self.hparams.items():
            if isinstance(value, torch.nn.Module):
                warnings.warn(f"Attribute {key!r} is an instance of `nn.Module` and is already saved during "
                              f"checkpointing. It is recommended to ignore them using "
                              f"`self.save_hyperparameters(ignore=[{key!r}])`.", UserWarning, stacklevel=2)
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(self.hparams))

    def _set_hparams(self, values: Any) -> None:
        """Merge a dict into the saved ``hparams``, or replace them by another config object (Lightning's)."""
        values = _hparams_dict(values)
        if isinstance(values, dict) and isinstance(self.hparams, dict):
            self.hparams.update(values)
        else:
            object.__setattr__(self, "_hparams", values)

    @property
    def hparams(self) -> AttributeDict | MutableMapping:
        """The saved hyperparameters (an ``AttributeDict``, or the mapping given to :meth:`save_hyperparameters`;
        empty before it)."""
        if "_hparams" not in self.__dict__:
            object.__setattr__(self, "_hparams", AttributeDict())
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of :attr:`hparams` as they were when saved."""
        return copy.deepcopy(AttributeDict(self.__dict__.get("_hparams_initial") or {}))

    def hparams_for_checkpoint(self) -> dict[str, Any]:
        """The JSON-serialisable hyperparameters (what a checkpoint's ``config.json`` stores); taskfit itself reads
        them with :func:`taskfit.loggers.logger.json_hparams`, so overriding this method changes nothing saved."""
        from taskfit.loggers.logger import json_hparams

        return json_hparams(self) or {}


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - tensors, arrays: not the same config
        return False


def rebuild_kwargs(cls: type, hparams: Mapping[str, Any], hparams_name: str | None,
                   overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``cls(**kwargs)`` is rebuilt with from a checkpoint's hyperparameters (Lightning's
    ``_load_state``): saved from one config argument (``hparams_name`` names it), they go in as that argument;
    else as keywords. ``overrides`` win; names ``cls.__init__`` does not take are dropped unless it takes
    ``**kwargs``."""
    _, var_args, var_kwargs = _init_keys(cls)
    names = [n for n in inspect.signature(cls.__init__).parameters if n not in (var_args, var_kwargs)][1:]
    loaded: dict[str, Any] = dict(hparams)
    if hparams_name and hparams_name in names:
        loaded = {hparams_name: loaded}
    kwargs = {**loaded, **overrides}
    return kwargs if var_kwargs else {k: v for k, v in kwargs.items() if k in names}
