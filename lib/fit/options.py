"""What ``Fit(...)``'s constructor turns its arguments into: one ``FitArguments`` (component names and keywords
override ``args``) and the callback list (the user's, the ones the arguments ask for, the console view)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskfit.arguments.fit_arguments import FitArguments
from taskfit.callbacks.console import LogPrinter
from taskfit.callbacks.progress import ProgressBar
from taskfit.callbacks.reporting import reporting_callbacks
from taskfit.callbacks.throughput import with_throughput_monitor
from taskfit.fit.hf_api import warn_if_duplicate

_COMPONENT_KEYS = ("accelerator", "strategy", "devices", "num_nodes", "precision")


def fit_arguments(args: FitArguments | Mapping | None, components: tuple[Any, ...], plugins: list[Any],
               kwargs: dict[str, Any]) -> tuple[FitArguments, list[Any], dict[str, Any]]:
    """``Fit(...)``'s options as one ``FitArguments`` (component names and keywords override ``args``), plus the
    plugin and component instances given.

    Raises:
        TypeError: ``args`` of another type. ValueError / NotImplementedError: as ``FitArguments``.
    """
    if args is None:
        args = FitArguments()
    elif isinstance(args, Mapping):
        args = FitArguments.from_dict(dict(args))
    elif not isinstance(args, FitArguments):
        raise TypeError(f"args must be FitArguments, a dict or None; got {type(args).__name__}.")
    instances: dict[str, Any] = {}
    overrides = dict(kwargs)
    for key, value in zip(_COMPONENT_KEYS, components):
        if value is None:
            continue
        if isinstance(value, (str, int, list, tuple)):
            overrides[key] = list(value) if isinstance(value, tuple) else value
        elif key == "precision":
            plugins.append(value)
        else:
            instances[key] = value
    if overrides:
        args = args.replace(**overrides)
    return args, plugins, instances


def default_callbacks(args: FitArguments, callbacks: list[Any] | None) -> list[Any]:
    """The user's callbacks plus the ones ``args`` asks for (throughput monitor, profiler) and the console view
    (a progress bar, or one line per log with ``disable_tqdm``); a user's own bar replaces the default one.
    ``report_to`` names that are transformers' integration callbacks (``"kubeflow"``) come first, as in HF."""
    out: list[Any] = reporting_callbacks(args.report_to)
    for cb in callbacks or []:
        warn_if_duplicate(out, cb)
        out.append(cb)
    out = with_throughput_monitor(args, out)
    if args.profiler:  # a callback: a run without a profiler pays nothing for it
        from taskfit.callbacks.profilers import profiler_from_args

        out.append(profiler_from_args(args))
    if any(isinstance(cb, ProgressBar) for cb in out):
        pass  # the user's bar (tqdm or rich) replaces the default console view, as in Lightning
    elif args.disable_tqdm:  # the console view: one line per log, or the bar
        out.append(LogPrinter())
    else:
        out.insert(0, ProgressBar())
    return out
