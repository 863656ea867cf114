"""Name -> component registries with "did you mean" errors.

Every component family (accelerators, strategies, precision plugins, optimizers, LR schedules, checkpoint IO)
has one :class:`Registry` mapping a user-facing name (``"fsdp"``, ``"bf16-mixed"``, ``"adamw_torch"``) to a
factory and its default keyword arguments. Lookups of unknown names raise :class:`ValueError` naming the bad
value, the valid choices and the closest match.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ``' Did you mean "x"?'`` for the closest of ``choices`` to ``value``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f' Did you mean "{close[0]}"?' if close else ""


class UnknownOptionError(TypeError, ValueError):
    """An option name that does not exist. A ``TypeError`` like any unexpected keyword argument, and a
    ``ValueError`` like every other bad option."""


def closest_names(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` closest to ``value`` (difflib ratio >= 0.6, plus names containing it)."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value), choices, n=n, cutoff=0.6)
    close += [c for c in sorted(choices) if str(value) in c and c not in close and len(str(value)) >= 3]
    return close[:n]


def unknown_option(what: str, value: str, choices: Iterable[str], listing: str,
                   aliases: dict[str, str] | None = None) -> UnknownOptionError:
    """The error for an unknown option name: the closest names only (not the whole list; ``aliases`` maps names
    other libraries use to ours) and where to see them all (``listing``)."""
    close = [aliases[value]] if aliases and value in aliases else closest_names(value, choices)
    hint = (f" Did you mean {' or '.join(repr(c).replace(chr(39), chr(34)) for c in close)}?" if close
            else " No option has a similar name.")
    return UnknownOptionError(f"Unknown {what} {value!r}.{hint} All options: {listing}.")


def invalid_choice(what: str, value: Any, choices: Iterable[str]) -> ValueError:
    """Build the one error used everywhere for an unknown name: bad value, valid choices, closest match."""
    choices = sorted(str(c) for c in choices)
    return ValueError(f"Unknown {what} {value!r}.{did_you_mean(str(value), choices)} Valid choices: {', '.join(choices)}.")


@dataclass
class RegistryEntry:
    """One registered name: the factory (usually a class), its default kwargs and a one-line description."""

    name: str
    factory: Callable[..., Any]
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    pending: str | None = None  # set when the name is reserved for a feature that has not landed yet

    def build(self, **overrides: Any) -> Any:
        """Instantiate ``factory(**init_kwargs, **overrides)``.

        Raises:
            NotImplementedError: the name is reserved for a later feature (``pending`` says which).
        """
        if self.pending:
            raise NotImplementedError(f"{self.name!r} is not implemented yet ({self.pending}).")
        return self.factory(**{**self.init_kwargs, **overrides})


class Registry:
    """A family's name registry (mirrors Lightning's ``_StrategyRegistry``/``_AcceleratorRegistry``).

    Args:
        family (str): what the names denote, used in error messages (``"strategy"``).
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, RegistryEntry] = {}

    def register(self, name: str, factory: Callable[..., Any] | None = None, *, description: str = "",
                 pending: str | None = None, override: bool = False, **init_kwargs: Any) -> Any:
        """Register ``factory`` under ``name``; usable as a decorator when ``factory`` is omitted.

        Raises:
            ValueError: ``name`` is already registered and ``override`` is False.
        """
        def _do(f: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries and not override:
                raise ValueError(f"{self.family} {name!r} is already registered; pass override=True to replace it.")
            self._entries[name] = RegistryEntry(name, f, dict(init_kwargs), description, pending)
            return f

        return _do(factory) if factory is not None else _do

    def get(self, name: str) -> RegistryEntry:
        """Return the entry for ``name``.

        Raises:
            ValueError: unknown name; the message lists the valid choices and the closest match.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise invalid_choice(self.family, name, self._entries) from None

    def build(self, name: str, **overrides: Any) -> Any:
        """Look up ``name`` and instantiate it (see :meth:`RegistryEntry.build`)."""
        return self.get(name).build(**overrides)

    def names(self, include_pending: bool = True) -> list[str]:
        """All registered names, sorted."""
        return sorted(n for n, e in self._entries.items() if include_pending or not e.pending)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()})"
