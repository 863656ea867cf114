"""The facade: ``Fit`` (configuration and the components it resolves) and what one call of
``fit``/``validate``/``test``/``predict`` runs."""

from taskfit.fit.fit import Fit
from taskfit.metrics import TrainOutput

__all__ = ["Fit", "TrainOutput"]
