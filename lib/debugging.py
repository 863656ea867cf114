"""Lightning's debugging switches: ``fast_dev_run``, ``limit_*_batches``, ``overfit_batches``,
``num_sanity_val_steps`` and ``detect_anomaly`` (mirrors ``lightning.pytorch.Trainer``'s flags of the same names).
Nothing here runs per step: limits wrap the loaders once, before the loops start."""

from __future__ import annotations

from typing import Any

LIMIT_FIELDS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")
_STAGE_LIMIT = {"fit": "limit_val_batches", "validate": "limit_val_batches", "test": "limit_test_batches",
                "predict": "limit_predict_batches"}


def validate_debug_options(a: Any) -> None:
    """Check the switches of ``FitArguments`` ``a``.

    Raises:
        ValueError: a negative count, a fraction outside [0, 1], a bad ``gradient_clip_algorithm`` or
            ``profiler``.
    """
    for name in LIMIT_FIELDS + ("overfit_batches",):
        v = getattr(a, name)
        if v is None:
            continue
        if isinstance(v, bool) or v < 0 or (isinstance(v, float) and v > 1):
            raise ValueError(f"{name}={v!r} is not valid: give a number of batches (int >= 0) or a fraction "
                             "of them (float in [0, 1]).")
    fdr = a.fast_dev_run
    if isinstance(fdr, bool) is False and (not isinstance(fdr, int) or fdr < 0):
        raise ValueError(f"fast_dev_run={fdr!r} is not valid: give True/False or a number of batches >= 0.")
    if not isinstance(a.num_sanity_val_steps, int) or a.num_sanity_val_steps < -1:
        raise ValueError(f"num_sanity_val_steps={a.num_sanity_val_steps!r} is not valid: give an int >= 0, or -1 "
                         "for every validation batch.")
    if a.profiler not in (None, "simple", "advanced", "pytorch"):
        raise ValueError(f"profiler={a.profiler!r} is not valid; choose 'simple', 'advanced', 'pytorch' or None.")
    if a.gradient_clip_algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={a.gradient_clip_algorithm!r} is not valid; choose 'norm' "
                         "(max_grad_norm clips the L2 norm) or 'value' (clips each gradient element).")


def fast_dev_run_batches(a: Any) -> int:
    """Batches per stage under ``fast_dev_run`` (True = 1), 0 when it is off."""
    fdr = a.fast_dev_run
    return (1 if fdr else 0) if isinstance(fdr, bool) else int(fdr)


def batch_limit(a: Any, stage: str, train: bool) -> int | float | None:
    """The limit for the loader of ``stage`` (``fit`` training when ``train``): ``fast_dev_run`` first, then
    ``overfit_batches`` (training and validation), then ``limit_*_batches``; None = no limit."""
    n = fast_dev_run_batches(a)
    if n:
        return n
    if a.overfit_batches and stage in ("fit", "validate"):
        return a.overfit_batches
    return getattr(a, "limit_train_batches" if train else _STAGE_LIMIT[stage])


class _FirstBatches:
    """``itertools.islice(iterator, n)`` that keeps ``iterator`` after its last batch (islice drops it): a
    DataLoader iterator's worker processes live until the epoch's iterator is dropped, as under Lightning, whose
    batch limit leaves the loader's iterator unfinished."""

    def __init__(self, iterator: Any, n: int) -> None:
        self.iterator, self.left = iterator, n

    def __iter__(self) -> _FirstBatches:
        return self

    def __next__(self) -> Any:
        if self.left <= 0:
            raise StopIteration
        self.left -= 1
        return next(self.iterator)


class LimitedLoader:
    """The first ``num_batches`` batches of ``loader`` per pass; every other attribute (``dataset``, ``sampler``,
    ``batch_size``...) is the loader's own, so ``set_epoch`` and batch-size inference still see it.

    Args:
        loader (Iterable): a DataLoader or any iterable of batches.
        num_batches (int): batches per pass (>= 0).
    """

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader, self.num_batches = loader, num_batches
        # the latest pass's iterator: a DataLoader's workers live until the next pass starts or release()
        # (Lightning's batch limit leaves the iterator unfinished; its data fetcher keeps it as long)
        self._live: Any = None

    def __iter__(self) -> Any:
        it = _FirstBatches(iter(self.loader), self.num_batches)
        self._live = it  # the previous pass's iterator goes now, after the new one started
        return it

    def release(self) -> None:
        """Drop the latest pass's iterator (its DataLoader workers shut down)."""
        self._live = None

    def __len__(self) -> int:
        return self.num_batches

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_live": None}  # an iterator does not travel to another process

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "_live"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def limit_batches(loader: Any, limit: int | float | None, name: str = "limit_train_batches") -> Any:
    """``loader`` cut to ``limit`` batches per pass (Lightning's rules): an int is a count (at most the
    loader's length), a float a fraction of the length (``int(len * limit)``); None or 1.0 leaves it whole.

    Raises:
        ValueError: a fraction of a loader without a length, or a fraction so small that no batch is left.
    """
    if limit is None or (isinstance(limit, float) and limit == 1.0):
        return loader
    try:
        length: int | None = len(loader)
    except TypeError:
        length = None
    if isinstance(limit, float):
        if length is None:
            raise ValueError(f"{name}={limit} is a fraction, but the data has no length (IterableDataset); "
                             "give a number of batches instead.")
        count = int(length * limit)
        if count == 0 and limit > 0:
            raise ValueError(f"{name}={limit} of {length} batches leaves none; raise it to at least "
                             f"{1 / length:.4g} or give a number of batches.")
    else:
        count = int(limit) if length is None else min(int(limit), length)
    return loader if count == length else LimitedLoader(loader, count)


def sanity_check(fit: Any, run: Any) -> None:
    """Lightning's ``num_sanity_val_steps``: the first N batches of every eval loader of ``run`` before training,
    with the validation hooks, neither logged nor counted (``fit.sanity_checking`` is True meanwhile)."""
    n = fit.args.num_sanity_val_steps
    fit.sanity_checking = True
    before = dict(fit.callback_metrics)  # Lightning resets what the sanity pass logged
    modes = [(m, m.training) for m in run.module.modules()]  # a submodule frozen in eval mode stays there
    try:
        fit._hooks.call("on_sanity_check_start", fit, run.module)
        if getattr(run, "build_eval_loaders", None) is not None:  # Lightning asks for the validation loader here
            run.build_eval_loaders()
        loaders = {k: (v if n == -1 else limit_batches(v, n)) for k, v in run.eval_loaders.items()}
        fit._run_eval(loaders, "validate", "eval")
        fit._hooks.call("on_sanity_check_end", fit, run.module)
    finally:
        fit.sanity_checking = False
        fit.callback_metrics.clear()
        fit.callback_metrics.update(before)
        run.module._results.reset_epoch()
        for m, mode in modes:
            m.training = mode
