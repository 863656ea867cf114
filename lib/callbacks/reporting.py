"""``report_to`` names that are transformers' own integration callbacks rather than taskfit loggers.

``"kubeflow"`` is ``transformers.integrations.KubeflowCallback`` itself (progress, ETA and the last logged numbers
posted to the Kubeflow Trainer server), run through taskfit's dispatch of HF ``TrainerCallback`` objects: it reads
only ``state.global_step``/``max_steps``/``epoch``/``is_world_process_zero`` and ``logs``, which taskfit's
``FitState`` and ``on_log`` give as HF does.
"""

from __future__ import annotations

from typing import Any

from taskfit.arguments.choices import HF_CALLBACK_REPORTERS
from taskfit.loggers.logger import require


def reporting_callbacks(report_to: list[str]) -> list[Any]:
    """One HF integration callback per name of :data:`HF_CALLBACK_REPORTERS` in ``report_to``, in HF's order
    (mirrors ``transformers.integrations.get_reporting_integration_callbacks``, which ``Trainer.__init__`` puts
    before the user's callbacks).

    Args:
        report_to (list[str]): the normalised ``FitArguments.report_to``.

    Returns:
        list: the callback objects (empty when no such name is listed; transformers is then never imported).

    Raises:
        ModuleNotFoundError: transformers is missing (names the ``hf`` extra).
        RuntimeError: ``"kubeflow"`` named without ``KUBEFLOW_TRAINER_SERVER_URL`` (transformers' own error).
    """
    names = [n for n in report_to if n in HF_CALLBACK_REPORTERS]
    if not names:
        return []
    require("transformers", "hf", f"report_to={names!r}")
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    return [INTEGRATION_TO_CALLBACK[n]() for n in names]


__all__ = ["reporting_callbacks"]
