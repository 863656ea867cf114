"""Learning-rate schedules by name (F-LOOP-5): ``lr_scheduler_type``, ``lr_scheduler_kwargs``, warmup.

The schedules are the ones of ``transformers.optimization`` (``get_scheduler`` and the ``get_*_schedule*``
functions), re-implemented here as ``LambdaLR`` multipliers so that ``transformers`` is not needed. Steps are
optimizer steps: the fit loop calls ``scheduler.step()`` once per optimizer step, except for metric schedulers
(:func:`is_metric_scheduler`, i.e. ``reduce_lr_on_plateau``) which it steps with the evaluation metric.
"""

from __future__ import annotations

import inspect
import json
import math
from functools import partial
from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau

from taskfit.optim.layerwise import LayerWiseOptimizer, LayerWiseScheduler
from taskfit.optim.names import LR_SCHEDULER_NAMES
from taskfit.registry import Registry

__all__ = [
    "SCHEDULERS",
    "accepted_scheduler_kwargs",
    "create_scheduler",
    "get_warmup_steps",
    "is_metric_scheduler",
]

_SHAPES = ("linear", "cosine", "1-sqrt")


# ------------------------------------------------------------------------------------- multipliers of lr
def _warmup(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _constant_lambda(step: int) -> float:
    return 1.0


def _constant_warmup_lambda(step: int, *, num_warmup_steps: int) -> float:
    return _warmup(step, num_warmup_steps) if step < num_warmup_steps else 1.0


def _linear_lambda(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine_lambda(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float, min_lr_rate: float = 0.0
) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate)


def _cosine_restarts_lambda(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int
) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _polynomial_lambda(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float, lr_init: float
) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    decay_steps = max(1, num_training_steps - num_warmup_steps)
    pct_remaining = 1.0 - (step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * pct_remaining**power + lr_end) / lr_init


def _inverse_sqrt_lambda(step: int, *, num_warmup_steps: int, timescale: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _cosine_warmup_min_lr_lambda(
    step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float,
    warmup_lr_rate: float | None,
) -> float:
    if step < num_warmup_steps:
        if warmup_lr_rate is None:
            return (step + 1.0) / max(1.0, float(num_warmup_steps))
        return warmup_lr_rate + (1.0 - warmup_lr_rate) * step / max(1.0, num_warmup_steps - 1.0)
    progress = (step - num_warmup_steps + 1.0) / max(1.0, float(num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate)


def _wsd_lambda(
    step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str,
    decay_type: str,
    min_lr_ratio: float,
    num_cycles: float,
) -> float:
    if step < num_warmup_steps:
        progress = float(step) / float(max(1, num_warmup_steps))
        if warmup_type == "linear":
            factor = progress
        elif warmup_type == "cosine":
            factor = 0.5 * (1.0 - math.cos(math.pi * progress))
        else:  # "1-sqrt"
            factor = 1.0 - math.sqrt(1.0 - progress)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_warmup_steps + num_stable_steps + num_decay_steps:
        progress = float(step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        if decay_type == "linear":
            factor = 1.0 - progress
        elif decay_type == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
        else:  # "1-sqrt"
            factor = 1.0 - math.sqrt(progress)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    return min_lr_ratio


# ------------------------------------------------------------------------------------------------ builders
# Every builder is f(optimizer, *, num_warmup_steps, num_training_steps, **schedule_kwargs); the keyword-only
# parameters after the first two are what ``lr_scheduler_kwargs`` may set.
def _lambda(optimizer: Optimizer, fn: Callable[..., float], **kwargs: Any) -> LambdaLR:
    return LambdaLR(optimizer, partial(fn, **kwargs) if kwargs else fn)


def _min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None, name: str) -> float:
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError(
            f"lr_scheduler_type={name!r}: set only one of min_lr or min_lr_rate in lr_scheduler_kwargs."
        )
    if min_lr is not None:
        return float(min_lr) / optimizer.defaults["lr"]
    if min_lr_rate is None:
        raise ValueError(f"lr_scheduler_type={name!r} needs min_lr or min_lr_rate in lr_scheduler_kwargs.")
    return float(min_lr_rate)


def build_linear(optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int) -> LambdaLR:
    """Linear warmup 0 -> lr, then linear decay to 0 at ``num_training_steps``
    (``get_linear_schedule_with_warmup``)."""
    return _lambda(
        optimizer, _linear_lambda, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps
    )


def build_cosine(
    optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5
) -> LambdaLR:
    """Warmup, then cosine ``0.5 * (1 + cos(2 pi num_cycles progress))``
    (``get_cosine_schedule_with_warmup``)."""
    return _lambda(
        optimizer,
        _cosine_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )


def build_cosine_with_restarts(
    optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int = 1
) -> LambdaLR:
    """Warmup, then ``num_cycles`` cosine decays with hard restarts to lr
    (``get_cosine_with_hard_restarts_schedule_with_warmup``)."""
    return _lambda(
        optimizer,
        _cosine_restarts_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )


def build_polynomial(
    optimizer: Optimizer,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
) -> LambdaLR:
    """Warmup, then ``(lr - lr_end) * remaining**power + lr_end``
    (``get_polynomial_decay_schedule_with_warmup``).

    Raises:
        ValueError: ``lr_end`` is not smaller than the optimizer's initial lr.
    """
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(f"lr_end ({lr_end}) must be smaller than initial lr ({lr_init}).")
    return _lambda(
        optimizer,
        _polynomial_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )


def build_constant(optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int) -> LambdaLR:
    """Constant lr; warmup is ignored, as in HF ``get_constant_schedule`` (use ``constant_with_warmup``)."""
    return _lambda(optimizer, _constant_lambda)


def build_constant_with_warmup(
    optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int
) -> LambdaLR:
    """Linear warmup, then constant lr (``get_constant_schedule_with_warmup``)."""
    return _lambda(optimizer, _constant_warmup_lambda, num_warmup_steps=num_warmup_steps)


def build_inverse_sqrt(
    optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int, timescale: float | None = None
) -> LambdaLR:
    """Warmup, then ``1 / sqrt((step + timescale - warmup) / timescale)``; ``timescale`` defaults to the
    warmup steps, or 10 000 without warmup (``get_inverse_sqrt_schedule``)."""
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    return _lambda(optimizer, _inverse_sqrt_lambda, num_warmup_steps=num_warmup_steps, timescale=timescale)


def build_reduce_lr_on_plateau(
    optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int, **kwargs: Any
) -> ReduceLROnPlateau:
    """``torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **kwargs)``; warmup is ignored
    (``get_reduce_on_plateau_schedule``). Stepped with the evaluation metric, see
    :func:`is_metric_scheduler`."""
    return ReduceLROnPlateau(optimizer, **kwargs)


def build_greedy(optimizer: Optimizer, *, num_warmup_steps: int, num_training_steps: int, **kwargs: Any) -> Any:
    """``transformers.optimization.GreedyLR(optimizer, **kwargs)`` (HF ``lr_scheduler_type="greedy"``): like
    ``ReduceLROnPlateau`` it is stepped with the evaluation metric (:func:`is_metric_scheduler`), and it can raise
    the rate again; warmup is its own ``warmup`` keyword (HF passes no warmup steps either).

    Raises:
        ModuleNotFoundError: transformers is missing (``pip install 'taskfit[hf]'``).
    """
    from taskfit.optim.construct import require

    require("transformers", "transformers", "hf", "lr_scheduler_type='greedy' (transformers' GreedyLR)")
    from transformers.optimization import GreedyLR

    return GreedyLR(optimizer, **kwargs)


#: GreedyLR's keywords (transformers 5), so bad lr_scheduler_kwargs are refused before transformers is imported
build_greedy.accepts = (  # type: ignore[attr-defined]
    "mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "warmup", "min_lr", "max_lr", "eps",
    "verbose", "smooth", "window_size", "reset_start")


build_reduce_lr_on_plateau.accepts = tuple(  # type: ignore[attr-defined]
    n for n in inspect.signature(ReduceLROnPlateau.__init__).parameters if n not in ("self", "optimizer")
)


def build_cosine_with_min_lr(
    optimizer: Optimizer,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Cosine that ends at ``min_lr`` (absolute) or ``min_lr_rate * lr`` instead of 0
    (``get_cosine_with_min_lr_schedule_with_warmup``).

    Raises:
        ValueError: both or neither of ``min_lr``/``min_lr_rate`` are set.
    """
    rate = _min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_with_min_lr")
    return _lambda(
        optimizer,
        _cosine_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=rate,
    )


def build_cosine_warmup_with_min_lr(
    optimizer: Optimizer,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """Like ``cosine_with_min_lr`` but the warmup starts at ``(step + 1) / warmup`` (or at ``warmup_lr_rate``)
    and the decay is shifted by one step (``get_cosine_with_min_lr_schedule_with_warmup_lr_rate``).

    Raises:
        ValueError: both or neither of ``min_lr``/``min_lr_rate`` are set.
    """
    rate = _min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_warmup_with_min_lr")
    return _lambda(
        optimizer,
        _cosine_warmup_min_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=rate,
        warmup_lr_rate=None if warmup_lr_rate is None else float(warmup_lr_rate),
    )


def build_warmup_stable_decay(
    optimizer: Optimizer,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_decay_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> LambdaLR:
    """Warmup-stable-decay (``get_wsd_schedule``): warmup (``warmup_type``) from ``min_lr_ratio * lr`` to lr,
    hold lr for ``num_stable_steps`` (default: what is left of ``num_training_steps`` after warmup and decay),
    decay (``decay_type``) over ``num_decay_steps`` to ``min_lr_ratio * lr`` and stay there.

    Raises:
        ValueError: ``num_decay_steps`` missing; an unknown ``warmup_type``/``decay_type`` (valid: linear,
            cosine, 1-sqrt); the derived ``num_stable_steps`` is negative.
    """
    if num_decay_steps is None:
        raise ValueError(
            "lr_scheduler_type='warmup_stable_decay' needs num_decay_steps in lr_scheduler_kwargs."
        )
    for what, value in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if value not in _SHAPES:
            raise ValueError(
                f"Unknown {what} {value!r} for warmup_stable_decay; expected one of {', '.join(_SHAPES)}."
            )
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
        if num_stable_steps < 0:
            raise ValueError(
                f"warmup_stable_decay: warmup ({num_warmup_steps}) + num_decay_steps ({num_decay_steps}) "
                f"exceed num_training_steps ({num_training_steps})."
            )
    return _lambda(
        optimizer,
        _wsd_lambda,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=float(min_lr_ratio),
        num_cycles=num_cycles,
    )


SCHEDULERS = Registry("lr_scheduler_type")
"""``lr_scheduler_type`` names (HF ``SchedulerType``) -> builders ``f(optimizer, *, num_warmup_steps,
num_training_steps, **lr_scheduler_kwargs)``."""

_BUILDERS = {
    "linear": build_linear,
    "cosine": build_cosine,
    "cosine_with_restarts": build_cosine_with_restarts,
    "polynomial": build_polynomial,
    "constant": build_constant,
    "constant_with_warmup": build_constant_with_warmup,
    "inverse_sqrt": build_inverse_sqrt,
    "reduce_lr_on_plateau": build_reduce_lr_on_plateau,
    "cosine_with_min_lr": build_cosine_with_min_lr,
    "cosine_warmup_with_min_lr": build_cosine_warmup_with_min_lr,
    "warmup_stable_decay": build_warmup_stable_decay,
    "greedy": build_greedy,
}
assert tuple(_BUILDERS) == LR_SCHEDULER_NAMES, "taskfit.optim.names and the schedule builders disagree"
for _name in LR_SCHEDULER_NAMES:
    SCHEDULERS.register(_name, _BUILDERS[_name], description=(_BUILDERS[_name].__doc__ or "").split("\n")[0])
del _name


# --------------------------------------------------------------------------------------------- public API
def accepted_scheduler_kwargs(name: str) -> tuple[str, ...]:
    """The ``lr_scheduler_kwargs`` keys that schedule ``name`` accepts.

    Raises:
        ValueError: unknown ``name`` (with "Did you mean").
    """
    fn = SCHEDULERS.get(name).factory
    if hasattr(fn, "accepts"):
        return tuple(fn.accepts)
    params = inspect.signature(fn).parameters
    return tuple(
        n
        for n, p in params.items()
        if p.kind is p.KEYWORD_ONLY and n not in ("num_warmup_steps", "num_training_steps")
    )


def _scheduler_kwargs(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"lr_scheduler_kwargs is not valid JSON ({err}): {value!r}.") from None
    if not isinstance(value, dict):
        raise TypeError(f"lr_scheduler_kwargs must be a dict or a JSON object string, got {value!r}.")
    return dict(value)


def get_warmup_steps(args: Any, num_training_steps: int) -> int:
    """Number of linear-warmup optimizer steps for a run of ``num_training_steps`` steps.

    Mirrors ``TrainingArguments.get_warmup_steps``: ``warmup_steps >= 1`` is a step count (a float is
    truncated with ``int``, as HF does); ``0 < warmup_steps < 1`` is a ratio of ``num_training_steps`` (HF 5
    semantics); ``warmup_steps == 0`` falls back to ``ceil(warmup_ratio * num_training_steps)`` (HF 4
    ``warmup_ratio``).

    Args:
        args (Any): object with ``warmup_steps`` (int | float, default 0) and ``warmup_ratio`` (float in
            [0, 1], default 0.0).
        num_training_steps (int): total optimizer steps of the run.

    Returns:
        int: warmup steps (>= 0).

    Raises:
        ValueError: negative ``warmup_steps`` or ``num_training_steps``, ``warmup_ratio`` outside [0, 1].
    """
    warmup_steps = getattr(args, "warmup_steps", 0) or 0
    warmup_ratio = getattr(args, "warmup_ratio", 0.0) or 0.0
    if num_training_steps < 0:
        raise ValueError(f"num_training_steps must be >= 0, got {num_training_steps}.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if not 0.0 <= warmup_ratio <= 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1], got {warmup_ratio}.")
    if warmup_steps >= 1:
        return int(warmup_steps)
    if warmup_steps > 0:
        return math.ceil(num_training_steps * warmup_steps)
    return math.ceil(num_training_steps * warmup_ratio)


def create_scheduler(
    optimizer: Optimizer, args: Any, num_training_steps: int
) -> LRScheduler | ReduceLROnPlateau:
    """Build the LR schedule named by ``args.lr_scheduler_type`` for ``optimizer``.

    Mirrors ``transformers.Trainer.create_scheduler`` / ``transformers.get_scheduler``. Reads from ``args``
    (duck-typed, ``TrainingArguments`` names): ``lr_scheduler_type`` (str or enum with ``.value``, default
    ``"linear"``), ``lr_scheduler_kwargs`` (dict, JSON object string or None),
    ``warmup_steps``/``warmup_ratio`` (see :func:`get_warmup_steps`). The LR multipliers are evaluated at the
    optimizer step count; the schedule's base lr is each param group's lr when the schedule is built.

    Args:
        optimizer (torch.optim.Optimizer): the optimizer whose param-group lrs are scheduled.
        args (Any): object with the attributes above.
        num_training_steps (int): total optimizer steps of the run (>= 0).

    Returns:
        LRScheduler | ReduceLROnPlateau: a ``LambdaLR`` for every name except ``reduce_lr_on_plateau``, which
        returns ``ReduceLROnPlateau`` (``is_metric_scheduler`` is True for it). For a layer-wise optimizer
        (``*_layerwise``) a :class:`~taskfit.optim.layerwise.LayerWiseScheduler`: one such schedule per parameter,
        stepped in its backward hook (HF ``get_scheduler``'s layer-wise branch).

    Raises:
        ValueError: unknown ``lr_scheduler_type`` (valid names and a "Did you mean"); bad JSON in
            ``lr_scheduler_kwargs``; invalid values for the schedule (e.g. ``lr_end >= lr``, missing
            ``min_lr``); bad warmup settings. ``reduce_lr_on_plateau`` for a layer-wise optimizer.
        TypeError: ``lr_scheduler_kwargs`` keys the schedule does not accept (names them and the accepted
            ones); ``lr_scheduler_kwargs`` is neither a dict nor a JSON object string.
    """
    name = getattr(args, "lr_scheduler_type", "linear")
    name = getattr(name, "value", name)
    entry = SCHEDULERS.get(name)
    kwargs = _scheduler_kwargs(getattr(args, "lr_scheduler_kwargs", None))
    accepted = accepted_scheduler_kwargs(name)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        hint = (
            " (set warmup_steps / warmup_ratio and max_steps on the arguments instead)"
            if any(k in ("num_warmup_steps", "num_training_steps") for k in unknown)
            else ""
        )
        raise TypeError(
            f"lr_scheduler_kwargs {unknown} are not accepted by lr_scheduler_type={name!r}; accepted: "
            f"{', '.join(accepted) or 'none'}{hint}."
        )
    num_warmup_steps = get_warmup_steps(args, num_training_steps)
    if isinstance(optimizer, LayerWiseOptimizer):  # one schedule per parameter, stepped in its backward hook (HF)
        if name in ("reduce_lr_on_plateau", "greedy"):
            raise ValueError(f"lr_scheduler_type={name!r} steps with an evaluation metric, but optim="
                             f"{optimizer.name!r} steps each parameter's schedule inside backward, where there is "
                             "none; choose another lr_scheduler_type.")
        return LayerWiseScheduler(optimizer, lambda opt: entry.build(
            optimizer=opt, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, **kwargs))
    return entry.build(
        optimizer=optimizer,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        **kwargs,
    )


def is_metric_scheduler(scheduler: Any) -> bool:
    """True when ``scheduler`` is stepped with a metric at evaluation (``ReduceLROnPlateau``) rather than once
    per optimizer step (``ReduceLROnPlateau``, transformers' ``GreedyLR``); mirrors the ``isinstance(...,
    (ReduceLROnPlateau, GreedyLR))`` checks in HF ``Trainer``."""
    if isinstance(scheduler, ReduceLROnPlateau):
        return True
    # transformers' GreedyLR (lr_scheduler_type="greedy"), checked by name so transformers need not be imported
    return any(c.__name__ == "GreedyLR" and c.__module__.startswith("transformers") for c in type(scheduler).__mro__)
