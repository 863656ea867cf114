"""Lightning's ``lightning.pytorch.utilities.model_helpers.is_overridden`` for the door's own classes, and its
``PossibleUserWarning``, ``MisconfigurationException`` and ``CombinedLoader`` (``lightning.pytorch.utilities``)."""

from __future__ import annotations

from typing import Any

from lightning_utilities.core.overrides import is_overridden as _is_overridden
from taskfit.callbacks.base import LightningCallback as Callback
from taskfit.core.module import TaskModule
from taskfit.data.combined import CombinedLoader
from taskfit.data.loaders import DataModule
from taskfit.errors import ConfigurationError, also_catchable_as, with_peer

__all__ = ["CombinedLoader", "MisconfigurationException", "PossibleUserWarning", "is_overridden"]

#: Lightning's ``lightning.pytorch.utilities.exceptions.MisconfigurationException``: taskfit's configuration error (a
#: ``ValueError``); once Lightning is imported, what taskfit raises also derives from Lightning's class
MisconfigurationException = ConfigurationError
also_catchable_as(ConfigurationError, "lightning.fabric.utilities.exceptions", "MisconfigurationException")


class PossibleUserWarning(UserWarning):
    """A warning about a setting that may be a mistake (``max_epochs`` not set...); Lightning's
    ``lightning.fabric.utilities.warnings.PossibleUserWarning``."""


def possible_user_warning() -> type[Warning]:
    """The class of the door's ``PossibleUserWarning``: :class:`PossibleUserWarning`, and when the program already
    imported Lightning a subclass of both it and Lightning's ``lightning.fabric.utilities.warnings.
    PossibleUserWarning`` (so ``warnings.filterwarnings(category=...)`` and ``pytest.warns`` with either class keep
    working after the import swap). Never imports Lightning."""
    return with_peer(PossibleUserWarning, "lightning.fabric.utilities.warnings", "PossibleUserWarning")


def is_overridden(method_name: str, instance: Any = None, parent: type | None = None) -> bool:
    """Whether ``instance`` overrides ``method_name`` of ``parent``; mirrors Lightning's
    ``lightning.pytorch.utilities.model_helpers.is_overridden``.

    Args:
        method_name (str): the method's name, e.g. ``"validation_step"``.
        instance (object | None): the object to inspect; None gives False.
        parent (type | None): the class whose method counts as not overridden; None picks ``LightningModule``
            (``TaskModule``), ``LightningDataModule`` (``DataModule``) or ``Callback`` from ``instance``'s type.

    Returns:
        bool: True when the method differs from ``parent``'s (an instance attribute counts; one set to None
        means not overridden).

    Raises:
        ValueError: ``"Expected a parent"`` when ``parent`` is None and ``instance`` is none of the three kinds.
    """
    if instance is None:
        return False
    if parent is None:
        parent = next((p for p in (TaskModule, DataModule, Callback) if isinstance(instance, p)), None)
        if parent is None:
            raise ValueError("Expected a parent")
    return _is_overridden(method_name, instance, parent)
