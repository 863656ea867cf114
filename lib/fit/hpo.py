"""Hyperparameter search with Optuna (F-HPO-1), behind ``Fit.hyperparameter_search``. Mirrors HF
``Trainer.hyperparameter_search`` (``hp_space``, ``compute_objective``, ``n_trials``, ``direction``,
``backend``, ``model_init`` taking the trial, ``BestRun``), with Optuna as the one backend (extra ``optuna``)."""

from __future__ import annotations

import inspect
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from taskfit.callbacks.base import Callback
from taskfit.loggers import build_loggers
from taskfit.loggers.logger import require

if TYPE_CHECKING:
    from taskfit.protocols import FitView

log = logging.getLogger("taskfit")
BACKENDS = ("optuna",)
DIRECTIONS = ("minimize", "maximize")
#: options a trial may not change: they pick the components Fit already built
_FIXED = ("accelerator", "strategy", "devices", "num_nodes", "precision", "bf16", "fp16", "output_dir", "logging_dir")
_SPEED = ("_runtime", "_per_second", "_mem_cpu_alloc_delta", "_mem_cpu_peaked_delta", "_mem_gpu_alloc_delta",
          "_mem_gpu_peaked_delta", "_flops_per_second", "_mfu")


class BestRun(NamedTuple):
    """The best trial of a search (mirrors ``transformers.trainer_utils.BestRun``).

    Attributes:
        run_id (str): the trial number; its run lives in ``output_dir/run-{run_id}``.
        objective (float | list[float]): its objective value (one per direction when multi-objective).
        hyperparameters (dict[str, Any]): the values ``hp_space`` drew for it.
        run_summary (Any): the Optuna ``FrozenTrial``.
    """

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """HF's default space: ``learning_rate`` log-uniform in [1e-6, 1e-4], ``num_train_epochs`` 1..5, ``seed``
    1..40, ``per_device_train_batch_size`` in {4, 8, 16, 32, 64}."""
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
            "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
            "seed": trial.suggest_int("seed", 1, 40),
            "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64])}


def default_compute_objective(metrics: dict[str, float]) -> float:
    """HF's rule: ``eval_loss`` when it is the only evaluation metric, else the sum of the other evaluation
    metrics (speed, memory and ``epoch`` left out); ``train_loss`` when there was no evaluation."""
    evals = {k: v for k, v in metrics.items() if k.startswith("eval_") and not k.endswith(_SPEED)}
    if not evals:
        return float(metrics["train_loss"])
    loss = evals.pop("eval_loss", None)
    return float(loss) if not evals else float(sum(evals.values()))


class _TrialCallback(Callback):
    """Reports each evaluation's objective to the trial and stops training when Optuna prunes it."""

    def __init__(self, trial: Any, compute_objective: Callable, report: bool) -> None:
        self.trial, self.compute_objective, self.report = trial, compute_objective, report
        self.last_metrics: dict[str, float] | None = None
        self.pruned = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.is_hyper_param_search, state.trial_name = True, f"run-{self.trial.number}"

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.last_metrics = dict(metrics or {})
        if not self.report:
            return
        self.trial.report(float(self.compute_objective(self.last_metrics)), state.global_step)
        if self.trial.should_prune():
            self.pruned = control.should_training_stop = True


def hyperparameter_search(fit: FitView, hp_space: Callable[[Any], dict] | None = None,
                          compute_objective: Callable[[dict], float | list[float]] | None = None,
                          n_trials: int = 20, direction: str | list[str] = "minimize", backend: str = "optuna",
                          hp_name: Callable[[Any], str] | None = None, *, train_data: Any = None,
                          eval_data: Any = None, data_collator: Callable | None = None,
                          model_init: Callable | None = None, timeout: float | None = None,
                          **study_kwargs: Any) -> BestRun | list[BestRun]:
    """Search hyperparameters with Optuna: each trial trains a fresh ``model_init()`` model with the arguments
    ``hp_space(trial)`` returns, logs under ``output_dir/run-{trial.number}``, reports each evaluation's
    objective for pruning (single objective), and is scored by ``compute_objective`` on its final evaluation.
    Trials log through the loggers ``report_to`` names (logger objects given to ``Fit`` are not reused); the
    ``fit`` object is restored afterwards.

    Args:
        fit (Fit): the run whose arguments, callbacks, metric and loss functions every trial reuses.
        hp_space (Callable[[optuna.Trial], dict] | None): FitArguments values for a trial; default
            :func:`default_hp_space_optuna`. Keys that are not FitArguments fields are allowed only when
            ``model_init`` takes the trial (then they are the model's own hyperparameters).
        compute_objective (Callable[[dict], float | list[float]] | None): metrics -> objective(s); default
            :func:`default_compute_objective`.
        n_trials (int): number of trials (>= 1).
        direction (str | list[str]): ``"minimize"``/``"maximize"``, or a list for multi-objective search.
        backend (str): ``"optuna"`` (the only one).
        hp_name (Callable[[optuna.Trial], str] | None): run name of a trial (default ``run-{number}``).
        train_data / eval_data / data_collator: as for :meth:`Fit.fit` (``eval_data`` may be a dict); default
            the ``train_dataset`` / ``eval_dataset`` given to ``Fit`` (HF searches over the Trainer's datasets).
        model_init (Callable | None): ``model_init()``, or ``model_init(trial)`` when it has a required argument
            (HF passes the trial by parameter count); default ``fit.model_init``.
        timeout (float | None): stop starting trials after this many seconds.
        **study_kwargs: passed to ``optuna.create_study`` (``sampler``, ``pruner``, ``storage``, ``study_name``...).

    Returns:
        BestRun for one direction; a list of BestRun (the Pareto front) for several.

    Raises:
        ModuleNotFoundError: optuna is missing (``pip install 'taskfit[optuna]'``).
        ValueError: an unknown backend or direction, ``n_trials < 1``, no ``model_init``, no training data,
            or a trial setting an unknown or component-choosing option (named, before it trains).
    """
    directions = _checked_directions(backend, direction, n_trials)
    init = model_init or fit.model_init
    if init is None:
        raise ValueError("hyperparameter_search needs model_init (a callable returning a fresh model) so every "
                         "trial starts from new weights: pass model_init= here or to Fit.")
    if train_data is None:  # HF searches over the datasets given to the Trainer
        train_data = fit.train_dataset
        eval_data = fit.eval_dataset if eval_data is None else eval_data
    if train_data is None:
        raise ValueError("hyperparameter_search needs train_data (and usually eval_data) to train each trial on: "
                         "pass them here or as Fit(train_dataset=..., eval_dataset=...).")
    require("optuna", "optuna", "hyperparameter_search(backend='optuna')")
    import optuna

    saved = (fit.args, fit.loggers, fit.model_init)
    objective = _Objective(fit, init, hp_space or default_hp_space_optuna,
                           compute_objective or default_compute_objective, len(directions), hp_name,
                           (train_data, eval_data, data_collator))
    study_kwargs.setdefault("directions" if len(directions) > 1 else "direction",
                            directions if len(directions) > 1 else directions[0])
    study = optuna.create_study(**study_kwargs)
    try:
        study.optimize(objective, n_trials=n_trials, timeout=timeout)
    finally:
        fit.args, fit.loggers, fit.model_init = saved
    if len(directions) > 1:
        return [BestRun(str(t.number), list(t.values), dict(t.params), t) for t in study.best_trials]
    best = study.best_trial
    return BestRun(str(best.number), best.value, dict(best.params), best)


def _checked_directions(backend: str, direction: str | list[str], n_trials: int) -> list[str]:
    """The search's directions as a list.

    Raises:
        ValueError: an unknown backend or direction, or ``n_trials`` not an integer >= 1.
    """
    if backend not in BACKENDS:
        raise ValueError(f"hyperparameter_search backend={backend!r} is not supported; choose one of {BACKENDS}.")
    directions = [direction] if isinstance(direction, str) else list(direction)
    for d in directions:
        if d not in DIRECTIONS:
            raise ValueError(f"direction {d!r} is not valid; choose one of {DIRECTIONS} (or a list of them).")
    if not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"n_trials must be an integer >= 1; got {n_trials!r}.")
    return directions


class _Objective:
    """One trial of the search: ``fit`` trains a fresh model with the trial's arguments under
    ``output_dir/run-{number}`` and is scored on its last evaluation (see :func:`hyperparameter_search`).

    Args:
        fit (Fit): the Fit every trial runs on (its ``args``/``loggers``/``model_init`` are set per trial).
        init (Callable): ``model_init``; takes the trial when it has a required argument (HF's rule).
        hp_space, compute_objective, hp_name: as :func:`hyperparameter_search`.
        n_directions (int): objectives per trial. data (tuple): ``(train_data, eval_data, data_collator)``.
    """

    def __init__(self, fit: Any, init: Callable, hp_space: Callable, compute_objective: Callable,
                 n_directions: int, hp_name: Callable | None, data: tuple[Any, Any, Any]) -> None:
        self.fit, self.init, self.hp_space, self.compute_objective = fit, init, hp_space, compute_objective
        self.n_directions, self.hp_name, self.data = n_directions, hp_name, data
        self.takes_trial = any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                               for p in inspect.signature(init).parameters.values())  # a required argument
        self.base_args = fit.args
        self.fields = set(self.base_args.field_names())

    def __call__(self, trial: Any) -> float | list[float]:
        """Train and score one trial.

        Raises:
            ValueError: ``hp_space`` returned a key a trial cannot set. optuna.TrialPruned: the trial was pruned.
        """
        import optuna

        fit, init, base_args, fields = self.fit, self.init, self.base_args, self.fields
        params = dict(self.hp_space(trial))
        bad = [k for k in params if k in _FIXED or (k not in fields and not self.takes_trial)]
        if bad:
            raise ValueError(f"hp_space returned {bad}, which a trial cannot set: use FitArguments fields other "
                             f"than {list(_FIXED)} (or have model_init take the trial for model options).")
        name = self.hp_name(trial) if self.hp_name is not None else f"run-{trial.number}"
        folder = os.path.join(base_args.output_dir, f"run-{trial.number}")
        logging_dir = os.path.join(base_args.logging_dir, f"run-{trial.number}") if base_args.logging_dir else None
        fit.args = base_args.replace(output_dir=folder, logging_dir=logging_dir, run_name=name,
                                     **{k: v for k, v in params.items() if k in fields})
        fit.loggers = build_loggers(fit.args)  # fresh loggers per trial, writing under its run folder
        fit.model_init = (lambda: init(trial)) if self.takes_trial else init  # fit(None) builds the trial's model
        reporter = _TrialCallback(trial, self.compute_objective, report=self.n_directions == 1)
        train_data, eval_data, data_collator = self.data
        fit.add_callback(reporter)
        try:
            out = fit.fit(None, train_data, eval_data, data_collator=data_collator)
        finally:
            fit.pop_callback(reporter)
        if reporter.pruned:
            raise optuna.TrialPruned()
        metrics = reporter.last_metrics
        if metrics is None:
            metrics = fit.evaluate(data=eval_data) if eval_data is not None else dict(out)
        value = self.compute_objective(metrics)
        return [float(v) for v in value] if self.n_directions > 1 else float(value)
