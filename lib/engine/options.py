"""What ``Engine(...)``'s keyword options become: the :class:`~taskfit.arguments.strategy_options.StrategyOptions`
the connector builds the strategy from, and the Engine's own few (:class:`EngineOptions`: loggers, the default
run length). Each value is checked by the rule ``FitArguments`` applies to the same name; no ``FitArguments`` is
built (an Engine has no loop options to hold)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from typing import Any

from taskfit.arguments.strategy_options import StrategyOptions

#: Engine's defaults that differ from ``FitArguments``': the user's loop clips (``engine.clip_gradients``), so a
#: DeepSpeed engine does not clip unless told to
ENGINE_DEFAULTS: dict[str, Any] = {"max_grad_norm": 0.0}


@dataclass(frozen=True)
class EngineOptions:
    """The Engine's own options (``FitArguments`` names and meanings).

    Attributes:
        report_to (list[str]): logger names for :meth:`Engine.log` (``"none"``: none; ``"csv"``, ``"tensorboard"``,
            ``"mlflow"``, ``"wandb"``, ``"all"``).
        logging_dir (str | None): where built loggers write; None: ``<output_dir>/logs``.
        run_name (str | None): MLflow / W&B run name; None: ``output_dir``.
        output_dir (str): the folder ``logging_dir`` defaults under.
        max_steps (int): optimizer steps of the run, for a DeepSpeed config's own schedule when ``setup`` gets no
            ``max_steps``; <= 0: 1.
    """

    report_to: str | list[str] | None = field(default_factory=list)
    logging_dir: str | None = None
    run_name: str | None = None
    output_dir: str | None = "trainer_output"
    max_steps: int = -1

    @property
    def resolved_logging_dir(self) -> str:
        """``logging_dir``, else ``<output_dir>/logs`` (as ``FitArguments.resolved_logging_dir``)."""
        from taskfit.arguments.fit_arguments import default_logging_dir

        return self.logging_dir or default_logging_dir(self.output_dir or "trainer_output")

    @property
    def resolved_run_name(self) -> str:
        """``run_name``, else ``output_dir`` (HF)."""
        return self.run_name or self.output_dir or "trainer_output"


def engine_options(values: dict[str, Any]) -> tuple[StrategyOptions, EngineOptions]:
    """Split and check ``Engine(**options)``: the strategy's options (:meth:`StrategyOptions.from_values`, with
    :data:`ENGINE_DEFAULTS`) and the Engine's own.

    Args:
        values (dict[str, Any]): option name -> value (``FitArguments`` names).

    Returns:
        tuple[StrategyOptions, EngineOptions]

    Raises:
        UnknownOptionError (a ValueError and TypeError): a name the Engine does not read: a ``FitArguments``
            option of the training loop (named as such, with the Engine's options), or an unknown name (with the
            closest ones).
        ValueError: a bad value (naming it and the valid choices).
    """
    from taskfit.arguments.validation import check_values

    strategy_names = StrategyOptions.option_names()
    own_names = [f.name for f in fields(EngineOptions)]
    for key in values:
        if key not in strategy_names and key not in own_names:
            raise _not_an_option(key, strategy_names + own_names)
    strategy = StrategyOptions.from_values(**{**ENGINE_DEFAULTS,
                                              **{k: v for k, v in values.items() if k in strategy_names}})
    own = check_values(EngineOptions, {k: v for k, v in values.items() if k in own_names})
    return strategy, EngineOptions(**own)


def _not_an_option(key: str, valid: list[str]) -> Exception:
    from taskfit.arguments.fit_arguments import FitArguments
    from taskfit.registry import UnknownOptionError, unknown_option

    if key in FitArguments.field_names():
        return UnknownOptionError(f"Engine does not read {key!r}: it is an option of Fit's training loop, which an "
                                  f"Engine leaves to your loop. Engine options: {', '.join(sorted(valid))}.")
    return unknown_option("Engine option", key, valid, "help(Engine)")


def options_record(strategy: StrategyOptions, own: EngineOptions) -> str:
    """The options as JSON text (credentials redacted), the ``fit_args.json`` of an ``Engine.save`` folder."""
    return json.dumps({**strategy.to_dict(redact=True), **dataclasses.asdict(own)}, indent=2)


__all__ = ["ENGINE_DEFAULTS", "EngineOptions", "engine_options", "options_record"]
