"""The error taskfit raises for a configuration that cannot work (an option, a ``configure_optimizers`` result, a
``self.log`` call), and how a door makes it catchable as a peer's own class without importing the peer.

A configuration check raises ``configuration_error(message)``: a :class:`ConfigurationError` (a ``ValueError``, so
``except ValueError`` keeps working), or with ``kind=ConfigurationTypeError`` one that is also a ``TypeError``. A
door registers the peer's class once (:func:`also_catchable_as`); when the program has imported that peer, the
raised error is of a class deriving from both, so ``except <peer's class>`` catches it too. A user's own
``ValueError`` is never touched: only the checks that call :func:`configuration_error` raise these classes.
"""

from __future__ import annotations

import functools
import sys

__all__ = ["ConfigurationError", "ConfigurationTypeError", "also_catchable_as", "configuration_error", "with_peer"]


class ConfigurationError(ValueError):
    """A setting, argument or call that cannot work, found by one of taskfit's checks (mirrors Lightning's
    ``MisconfigurationException``; ``taskfit.lightning`` exports it under that name)."""


class ConfigurationTypeError(ConfigurationError, TypeError):
    """A :class:`ConfigurationError` where taskfit's ``Fit`` raised ``TypeError`` (a value of the wrong form, e.g. an
    unknown ``configure_optimizers`` result): still caught by ``except TypeError``."""


#: ``{our class: (peer module, peer class name)}``, filled by a door at its import
_PEERS: dict[type, tuple[str, str]] = {}


def also_catchable_as(ours: type[BaseException], module: str, name: str) -> None:
    """Make every later :func:`configuration_error` of class ``ours`` (or a subclass) catchable as
    ``<module>.<name>`` whenever the program has imported ``module``. Imports nothing.

    Args:
        ours (type): :class:`ConfigurationError` (the class whose raises gain the peer base).
        module (str): the peer's module, e.g. ``"lightning.fabric.utilities.exceptions"``.
        name (str): the class in it, e.g. ``"MisconfigurationException"``.
    """
    _PEERS[ours] = (module, name)


def with_peer(ours: type, module: str, name: str) -> type:
    """``ours``, or when the program imported ``module`` a class deriving from ``ours`` and ``<module>.<name>`` (one
    class per pair, cached), named as ``ours``. Used for errors and warnings alike; never imports ``module``."""
    theirs = getattr(sys.modules.get(module), name, None)
    return ours if theirs is None or issubclass(ours, theirs) else _both(ours, theirs)


@functools.cache
def _both(ours: type, theirs: type) -> type:
    return type(ours.__name__, (ours, theirs), {"__module__": ours.__module__, "__qualname__": ours.__qualname__})


def configuration_error(message: str, kind: type[ConfigurationError] = ConfigurationError) -> ConfigurationError:
    """The error to raise for a failed configuration check: ``kind(message)``, of a class that also derives from a
    registered peer class the program has imported (:func:`also_catchable_as`).

    Args:
        message (str): what is wrong, naming the bad value and the valid choices.
        kind (type): :class:`ConfigurationError` or :class:`ConfigurationTypeError`.

    Returns:
        ConfigurationError: the instance (the caller raises it).
    """
    peer = next((_PEERS[c] for c in kind.__mro__ if c in _PEERS), None)
    return (kind if peer is None else with_peer(kind, *peer))(message)
