"""Tuner callbacks (mirror Lightning's ``LearningRateFinder`` and ``BatchSizeFinder``): run the
:mod:`taskfit.tuner.tuner` search at fit start, put the weights, optimizer state and random state back exactly, then
train with the value found."""

from __future__ import annotations

from typing import Any

from taskfit.callbacks.base import Callback
from taskfit.tuner.tuner import lr_find, scale_batch_size


class _Isolated:
    """Keeps the module's owner and the random generators as they were around a tuning run (the tuning run
    seeds and attaches the module to its own ``Fit``)."""

    def __init__(self, fit: Any, module: Any) -> None:
        self.fit, self.module = fit, module

    def __enter__(self) -> _Isolated:
        from taskfit.seed import rng_states

        self.owner = getattr(self.module, "_fit", None)
        self.rng = rng_states(self.fit.strategy.accelerator)
        return self

    def __exit__(self, *exc: Any) -> None:
        from taskfit.seed import set_rng_states

        if hasattr(self.module, "_fit"):
            self.module._fit = self.owner
        set_rng_states(self.rng, self.fit.strategy.accelerator)


def _train_dataset(fit: Any, who: str) -> Any:
    loader = fit.run.train_loader
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise ValueError(f"{who} needs train data with a dataset (a Dataset or a DataLoader over one).")
    return dataset


class LearningRateFinder(Callback):
    """At fit start, :func:`taskfit.tuner.tuner.lr_find` on the run's module, arguments and training data; the weights
    come back exactly (the search trains on its own run: the run's optimizer state is untouched) and the random
    state too; with ``update_attr`` the suggestion is set on the module's ``lr`` / ``learning_rate`` (or
    ``attr_name``; without one, on ``fit.args.learning_rate``) and on every parameter group of the run's
    optimizers, so training continues with it (Lightning's ``LearningRateFinder``).

    Args:
        min_lr (float), max_lr (float): the range (``0 < min_lr < max_lr``).
        num_training_steps (int): steps of the search (>= 2).
        mode (str): ``"exponential"`` or ``"linear"``.
        early_stop_threshold (float | None): stop the search when the smoothed loss exceeds this times its best.
        update_attr (bool): apply the suggestion (see above).
        attr_name (str): the module attribute to set (empty: ``lr`` or ``learning_rate``).

    Attributes:
        optimal_lr (taskfit.tuner.tuner.LRFinder | None): the search's result (``results``, ``suggestion()``).

    Raises:
        ValueError: a bad ``mode``, range or ``num_training_steps`` (at construction).
    """

    runs_first = True  # Lightning's order: finders before the other callbacks

    def __init__(self, min_lr: float = 1e-8, max_lr: float = 1.0, num_training_steps: int = 100,
                 mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True,
                 attr_name: str = "") -> None:
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in ("exponential", "linear"):
            raise ValueError(f"LearningRateFinder mode={mode!r} is not valid; choose 'exponential' or 'linear'.")
        if not 0 < min_lr < max_lr:
            raise ValueError(f"LearningRateFinder needs 0 < min_lr < max_lr, got {min_lr!r}, {max_lr!r}.")
        if not isinstance(num_training_steps, int) or num_training_steps < 2:
            raise ValueError(f"LearningRateFinder num_training_steps={num_training_steps!r} must be an int >= 2.")
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self.optimal_lr: Any = None

    def lr_find(self, fit: Any, module: Any) -> None:
        """Run the search now (``on_fit_start`` calls it; a subclass may call it at other epochs)."""

        with _Isolated(fit, module):
            self.optimal_lr = lr_find(fit, module, _train_dataset(fit, "LearningRateFinder"), min_lr=self._min_lr,
                                      max_lr=self._max_lr, num_training=self._num_training_steps, mode=self._mode,
                                      early_stop_threshold=self._early_stop_threshold,
                                      update_attr=self._update_attr, attr_name=self._attr_name)
        lr = self.optimal_lr.suggestion()
        if self._update_attr and lr is not None:
            for opt in fit.run.optimizers:  # the run's optimizers were built with the old rate (Lightning too)
                for group in opt.param_groups:
                    group["lr"] = lr

    def on_fit_start(self, fit: Any, module: Any) -> None:
        self.lr_find(fit, module)


class BatchSizeFinder(Callback):
    """At fit start, :func:`taskfit.tuner.tuner.scale_batch_size` on the run's module, arguments and training dataset;
    the weights and random state come back exactly; then the run's train loader is rebuilt with the batch size
    found and the step plan (``max_steps``, logging/eval/save intervals) recomputed, so training uses it
    (Lightning's ``BatchSizeFinder``). The result is ``fit.args.per_device_train_batch_size`` and, when the module
    has the attribute ``batch_arg_name``, that attribute.

    Schedulers built before the search (``configure_optimizers`` reading ``estimated_stepping_batches``) keep
    their length, as in Lightning.

    Args:
        mode (str): ``"power"`` (double until out of memory) or ``"binsearch"`` (then bisect).
        steps_per_trial (int): optimizer steps per trial (>= 1).
        init_val (int): first batch size tried (>= 1).
        max_trials (int): most trials (>= 1).
        batch_arg_name (str): the module attribute that also receives the result.

    Attributes:
        optimal_batch_size (int | None): the batch size found.

    Raises:
        ValueError: a bad argument (at construction); at fit start, ``max_steps`` > 0 (the number of epochs would
            depend on the batch size found), or train data without a dataset.
    """

    runs_first = True  # Lightning's order: finders before the other callbacks

    def __init__(self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
                 batch_arg_name: str = "batch_size") -> None:
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in ("power", "binsearch"):
            raise ValueError(f"BatchSizeFinder mode={mode!r} is not valid; choose 'power' or 'binsearch'.")
        for name, v in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"BatchSizeFinder {name}={v!r} must be an int >= 1.")
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name = max_trials, batch_arg_name
        self.optimal_batch_size: int | None = None

    def scale_batch_size(self, fit: Any, module: Any) -> None:
        """Run the search now and rebuild the run's train loader (``on_fit_start`` calls it)."""
        from taskfit.loops.plan import accumulation_schedule, plan_steps, training_plan

        if fit.args.max_steps and fit.args.max_steps > 0:
            raise ValueError(f"BatchSizeFinder with max_steps={fit.args.max_steps}: the epochs of a max_steps run "
                             "depend on the batch size; set num_train_epochs instead.")
        run = fit.run
        dataset = _train_dataset(fit, "BatchSizeFinder")
        collate = getattr(run.train_loader, "collate_fn", None)
        with _Isolated(fit, module):
            size = scale_batch_size(fit, module, dataset, mode=self._mode, steps_per_trial=self._steps_per_trial,
                                    init_val=self._init_val, max_trials=self._max_trials)
        self.optimal_batch_size = size
        if self._batch_arg_name and hasattr(module, self._batch_arg_name):
            setattr(module, self._batch_arg_name, size)
        run.train_loader = fit._loader(dataset, train=True, collator=collate, what="train dataset", run=run)
        steps_per_epoch, max_steps, num_epochs = plan_steps(run.train_loader, fit.args,
                                                            accumulation_schedule(fit.callbacks))
        run.plan = training_plan(fit.args, run.train_loader, (steps_per_epoch, max_steps, num_epochs), size,
                                 run.plan.is_local_process_zero, run.plan.is_world_process_zero)

    def on_fit_start(self, fit: Any, module: Any) -> None:
        self.scale_batch_size(fit, module)
