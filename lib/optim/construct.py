"""The checks every optimizer builder shares (F-LOOP-4): a missing package names its extra, ``optim_args`` keys
the optimizer does not read are refused, HF's string options are converted, and the single-process test of the
optimizers that update inside backward.

Both :mod:`taskfit.optim.optimizers` (torch, bitsandbytes, lion) and :mod:`taskfit.optim.hf_optimizers` (the
optional packages HF's ``Trainer`` builds) import from here; nothing here imports either of them.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def require(module: str, package: str, extra: str, name: str) -> None:
    """Raise ``ModuleNotFoundError`` naming ``pip install 'taskfit[extra]'`` when ``module`` cannot be imported.

    Args:
        module (str): the import name (``"galore_torch"``).
        package (str): the distribution to install (``"galore-torch"``).
        extra (str): taskfit's extra that installs it (``"galore"``).
        name (str): the ``optim`` name that needs it (for the message).
    """
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"optim={name!r} needs the {package!r} package: pip install 'taskfit[{extra}]' "
                                  f"(or pip install {package}).")


def require_distribution(package: str, extra: str, name: str) -> None:
    """Like :func:`require` for a distribution name (``"lion-pytorch"``), checked with ``lightning_utilities``'
    ``RequirementCache`` (its message says why the requirement is not met)."""
    from lightning_utilities.core.imports import RequirementCache

    found = RequirementCache(package)
    if not found:
        raise ModuleNotFoundError(f"optim={name!r} needs the {package!r} package: pip install 'taskfit[{extra}]' "
                                  f"({found.message}).")


def option(optim_args: dict[str, Any], key: str, default: Any, kind: type = float) -> Any:
    """``kind(optim_args.pop(key, default))`` (HF reads ``optim_args`` as strings and converts the keys it
    knows); a ``bool`` option also takes ``"true"``/``"1"``/``"yes"``."""
    value = optim_args.pop(key, default)
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return value if value is None else kind(value)


def no_leftovers(name: str, optim_args: dict[str, Any]) -> None:
    """Refuse ``optim_args`` keys the builder did not read (HF would drop them silently).

    Raises:
        TypeError: names the keys.
    """
    if optim_args:
        raise TypeError(f"optim_args {sorted(optim_args)} are not read by optim={name!r}; remove them.")


def adam_kwargs(args: Any) -> dict[str, Any]:
    """``{"betas": (adam_beta1, adam_beta2), "eps": adam_epsilon}`` (HF's ``adam_kwargs``)."""
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


def accepted_kwargs(cls: type) -> list[str]:
    """Keyword arguments of ``cls.__init__`` other than ``self`` and ``params``."""
    sig = inspect.signature(cls.__init__)
    return [n for n, p in sig.parameters.items()
            if n not in ("self", "params") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def construct(name: str, cls: type[torch.optim.Optimizer], param_groups: list[dict[str, Any]],
              kwargs: dict[str, Any], optim_args: dict[str, Any]) -> torch.optim.Optimizer:
    """``cls(param_groups, **kwargs, **optim_args)`` after checking that every ``optim_args`` key is accepted.

    Raises:
        TypeError: an ``optim_args`` key that ``cls`` does not accept; names it and the accepted ones.
    """
    accepted = accepted_kwargs(cls)
    unknown = sorted(set(optim_args) - set(accepted))
    if unknown:
        raise TypeError(f"optim_args {unknown} are not accepted by optim={name!r} "
                        f"({cls.__module__}.{cls.__qualname__}); accepted: {', '.join(accepted)}.")
    return cls(param_groups, **{**kwargs, **optim_args})


def is_single_process(strategy: Any) -> bool:
    """Whether ``strategy`` runs one process that owns the whole model and the step: a ``SingleDeviceStrategy``
    (or subclass) with ``world_size == 1`` whose backend does not run the step itself. Optimizers that update
    parameters inside backward (LOMO, the layer-wise GaLore / APOLLO) need it: their hooks fire before any
    gradient sync."""
    return (strategy.world_size == 1 and not strategy.engine_owns_step
            and "SingleDeviceStrategy" in {c.__name__ for c in type(strategy).__mro__})
