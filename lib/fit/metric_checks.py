"""Checks of ``metric_for_best_model`` (mirrors HF's option): it must name a metric some evaluation produces.

When the evaluation's keys are known before training (a plain HF-style model without ``compute_metrics``
reports only ``eval_loss``), a name that cannot appear fails before the first step; otherwise the first
evaluation that lacks it fails, naming the metrics it did produce.
"""

from __future__ import annotations

from typing import Any

from taskfit.registry import closest_names

_SPEED = ("_runtime", "_per_second")


def metric_keys(metrics: dict[str, Any]) -> list[str]:
    """The metric names of an evaluation result, without speed metrics and ``epoch``."""
    return sorted(k for k in metrics if not k.endswith(_SPEED) and k != "epoch")


def missing_metric_error(name: str, key: str, metrics: dict[str, Any]) -> KeyError:
    """The error for ``metric_for_best_model=name`` (looked up as ``key``) absent from ``metrics``."""
    names = metric_keys(metrics)
    close = closest_names(key, names)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return KeyError(f"metric_for_best_model={name!r} ({key!r}) is not among the evaluation metrics {names}.{hint}")


def check_before_training(name: str | None, key: str, plain_model: bool, has_compute_metrics: bool,
                          single_eval_set: bool) -> None:
    """Fail before training when ``metric_for_best_model`` can be known to be missing: a plain model (its
    ``forward`` returns the loss) evaluated on one eval set without ``compute_metrics`` reports only
    ``eval_loss``.

    Args:
        name (str | None): ``metric_for_best_model``; key (str): its evaluation key (``eval_<name>``).
        plain_model (bool): the model is an HF-style ``nn.Module``, not a ``TaskModule`` (whose ``self.log``
            names are only known once it runs).
        has_compute_metrics (bool), single_eval_set (bool): as given to ``fit``.

    Raises:
        ValueError: the metric cannot be produced (names what can).
    """
    if not name or not plain_model or has_compute_metrics or not single_eval_set:
        return
    if key != "eval_loss":
        raise ValueError(f"metric_for_best_model={name!r} ({key!r}) can never be computed: without compute_metrics "
                         "a plain model's evaluation reports only 'eval_loss'. Pass compute_metrics=... returning "
                         f"{name!r}, or use metric_for_best_model='loss'.")
