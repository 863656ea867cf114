"""Loggers with Lightning's constructor arguments (``save_dir, name="lightning_logs", version=None, ...``): each
writes under ``save_dir/name/version_N`` (the next free N, as Lightning's) through the taskfit logger of the same
kind. Mirrors ``lightning.pytorch.loggers.CSVLogger`` / ``TensorBoardLogger`` / ``MLFlowLogger`` /
``WandbLogger``; ``taskfit.lightning.loggers`` exports them under those names."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from taskfit.loggers.csv_logger import CSVLogger as _CSV
from taskfit.loggers.mlflow import MLFlowLogger as _MLFlow
from taskfit.loggers.tensorboard import TensorBoardLogger as _TB
from taskfit.loggers.wandb import WandbLogger as _Wandb


def next_version(root: str) -> int:
    """The next free ``version_N`` index under ``root`` (0 when none exists), as Lightning's ``_get_next_version``."""
    if not os.path.isdir(root):
        return 0
    found = [int(d.split("_", 1)[1]) for d in os.listdir(root)
             if d.startswith("version_") and d.split("_", 1)[1].isdigit() and os.path.isdir(os.path.join(root, d))]
    return max(found) + 1 if found else 0


def write_hparams_yaml(path: str, hparams: Any, fs: Any = None) -> None:
    """Write ``hparams`` (a dict or ``argparse.Namespace``) to the YAML file ``path`` (through the fsspec filesystem
    ``fs`` when given), leaving out, with Lightning's warning, values YAML cannot write (mirrors
    ``lightning.pytorch.core.saving.save_hparams_to_yaml``)."""
    import warnings
    from argparse import Namespace

    import yaml

    hparams = vars(hparams) if isinstance(hparams, Namespace) else dict(hparams)
    kept = {}
    for k, v in hparams.items():
        v = dict(v) if isinstance(v, dict) else v  # an AttributeDict inside is written as a plain mapping
        try:
            yaml.dump(v)
        except (TypeError, ValueError, yaml.YAMLError):
            warnings.warn(f"Skipping '{k}' parameter because it is not possible to safely dump to YAML.",
                          UserWarning, stacklevel=2)
            continue
        kept[k] = v
    if fs is None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", newline="") as fp:
            yaml.dump(kept, fp)
    else:  # an fsspec folder (``memory://``, ``s3://``...), as the CSV logger writes
        fs.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with fs.open(path, "w") as fp:
            yaml.dump(kept, fp)


class _Versioned:
    """``name``, ``version``, ``root_dir`` and ``log_dir`` as Lightning's file loggers have them, and the
    hyperparameters they keep in ``log_dir/hparams.yaml`` (``NAME_HPARAMS_FILE``)."""

    NAME_HPARAMS_FILE = "hparams.yaml"

    @property
    def hparams(self) -> dict[str, Any]:
        """The hyperparameters received by ``log_hyperparams`` (what ``hparams.yaml`` holds)."""
        return self.__dict__.setdefault("_lightning_hparams", {})

    def _keep_hparams(self, params: Any) -> None:
        """Add ``params`` (a dict, an ``argparse.Namespace`` or None) to :attr:`hparams` and rewrite
        ``hparams.yaml``."""
        from argparse import Namespace

        self.hparams.update(vars(params) if isinstance(params, Namespace) else dict(params or {}))
        write_hparams_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self.hparams, getattr(self, "_fs", None))

    def _save_hparams(self) -> None:
        """Write ``hparams.yaml`` when it is not there yet (Lightning's ``TensorBoardLogger.save()``, whose flush has
        created the log folder by then: an empty file without any hyperparameters)."""
        path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        fs = getattr(self, "_fs", None)
        if not (fs.isfile(path) if fs is not None else os.path.isfile(path)):
            write_hparams_yaml(path, self.hparams, fs)

    def _place(self, save_dir: Any, name: str | None, version: int | str | None, prefix: str) -> str:
        if prefix:
            raise NotImplementedError(f"{type(self).__name__}(prefix={prefix!r}): metric name prefixes are not "
                                      "supported; name the metrics in self.log instead.")
        self._root_save_dir, self._name = str(save_dir), name or ""
        root = os.path.join(self._root_save_dir, self._name)
        self._version = next_version(root) if version is None else version
        version_dir = self._version if isinstance(self._version, str) else f"version_{self._version}"
        return os.path.join(root, version_dir)

    @property
    def name(self) -> str:
        """The experiment folder name (``"lightning_logs"`` by default)."""
        return self._name

    @property
    def version(self) -> int | str:
        """The version (an int gives the folder ``version_N``)."""
        return self._version

    @property
    def root_dir(self) -> str:
        """``save_dir/name`` (the ``name`` property, which a subclass may override)."""
        return os.path.join(self._root_save_dir, self.name or "")

    @property
    def log_dir(self) -> str:
        """``save_dir/name/version_N``: where the files go (and Lightning's default checkpoint folder's parent)."""
        return self.save_dir


class CSVLogger(_Versioned, _CSV):
    """``metrics.csv`` under ``save_dir/name/version_N`` (Lightning's ``CSVLogger(save_dir, name, version, prefix,
    flush_logs_every_n_steps)``).

    Raises:
        NotImplementedError: a non-empty ``prefix``.
    """

    def __init__(self, save_dir: Any, name: str | None = "lightning_logs", version: int | str | None = None,
                 prefix: str = "", flush_logs_every_n_steps: int = 100) -> None:
        _CSV.__init__(self, self._place(save_dir, name, version, prefix), flush_every=flush_logs_every_n_steps)
        self._opened = False

    def _open(self) -> None:
        """On first use (Lightning creates its CSV experiment writer then): an existing, non-empty ``log_dir``
        warns and its ``metrics.csv`` is deleted, as Lightning's ``_ExperimentWriter._check_log_dir_exists`` (a
        given ``version`` that names an earlier run's folder starts a new file, not an appended one)."""
        if self._opened:
            return
        self._opened = True
        if self._fs.exists(self.log_dir) and self._fs.listdir(self.log_dir):
            warnings.warn(f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files in "
                          "this directory will be deleted when the new ones are saved!", UserWarning, stacklevel=3)
            if self._fs.isfile(self.path):
                self._fs.rm_file(self.path)
        self._read = True  # nothing of an earlier run's metrics.csv is kept
        self._fs.makedirs(self.log_dir, exist_ok=True)

    def save(self) -> None:
        """Write the buffered rows (Lightning's ``CSVLogger.save``; ``hparams.yaml`` is written by
        :meth:`log_hyperparams` only, as Lightning's CSV experiment writer does)."""
        self._open()
        _CSV.save(self)

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """As the first use of the logger (:meth:`_open`), then the base's row keeping."""
        self._open()
        _CSV.resume(self, step, log_history)

    @property
    def experiment(self) -> Any:
        """The object that writes (this logger: ``log_metrics``/``log_hyperparams``/``save``, ``metrics``,
        ``metrics_file_path``), as Lightning's ``logger.experiment``; the first access opens it (:meth:`_open`)."""
        self._open()
        return self

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows logged and not written yet (Lightning's ``experiment.metrics``; emptied by :meth:`save`)."""
        return self._pending

    @property
    def metrics_file_path(self) -> str:
        """``log_dir/metrics.csv``."""
        return self.path

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """One row of ``metrics`` (tensors as numbers) at ``step``; without a step, the count of rows not written
        yet (Lightning's default)."""
        self._open()
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        super().log_metrics(values, len(self._pending) if step is None else step)

    def log_hyperparams(self, params: Any = None, *args: Any, **kwargs: Any) -> None:
        """Keep ``params`` (an ``argparse.Namespace``, a dict or None) in ``log_dir/hparams.yaml``, leaving out with
        a warning a value YAML cannot write, as Lightning's ``CSVLogger`` (``save_hparams_to_yaml``)."""
        self._open()
        self._keep_hparams(params)


class TensorBoardLogger(_Versioned, _TB):
    """TensorBoard events under ``save_dir/name/version_N[/sub_dir]`` (Lightning's ``TensorBoardLogger(save_dir,
    name, version, log_graph, default_hp_metric, prefix, sub_dir)``; ``~`` and ``$VARS`` in the folder are
    expanded), with Lightning's ``log_hyperparams(params, metrics=None)`` (``params`` also written to
    ``log_dir/hparams.yaml``), ``log_graph(model, input_array=None)`` and ``hparams``.

    Raises:
        NotImplementedError: a ``prefix``. ModuleNotFoundError: no tensorboard.
    """

    def __init__(self, save_dir: Any, name: str | None = "lightning_logs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "",
                 sub_dir: Any = None, **kwargs: Any) -> None:
        self.sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._log_graph, self._default_hp_metric = log_graph, default_hp_metric
        _TB.__init__(self, self._place(save_dir, name, version, prefix), **kwargs)
        self.save_dir = self.log_dir  # where the events go

    @property
    def log_dir(self) -> str:
        """``save_dir/name/version_N`` (a str version as given), plus ``sub_dir``, user and variables expanded
        (Lightning's ``TensorBoardLogger.log_dir``)."""
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        out = os.path.join(self.root_dir, version, *([self.sub_dir] if self.sub_dir else []))
        return os.path.expanduser(os.path.expandvars(out))

    def log_hyperparams(self, params: Any = None, metrics: Any = None, step: int | None = None) -> None:
        """Record ``params`` (a dict or ``argparse.Namespace``; keys of any type, nested dicts flattened with
        ``/``) in TensorBoard's HParams view and in ``log_dir/hparams.yaml``; ``metrics`` (a dict, or one value as
        ``hp_metric``; None: ``{"hp_metric": -1}`` unless ``default_hp_metric=False``, as Lightning) are logged
        with them through :meth:`log_metrics` at ``step`` (None, Lightning's default: written at step 0)."""
        import argparse

        params = vars(params) if isinstance(params, argparse.Namespace) else dict(params or {})
        flat = _flatten({str(k): v for k, v in params.items()})
        if metrics is None:  # Lightning's default_hp_metric: a placeholder row so the HParams view has a metric
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, dict):
            metrics = {"hp_metric": metrics}
        if metrics:
            self.log_metrics(metrics, step)
        _TB.log_hyperparams(self, flat)
        self._keep_hparams(params)

    def save(self) -> None:
        """Flush the events and write ``hparams.yaml`` when it is not there (Lightning's
        ``TensorBoardLogger.save``)."""
        save = getattr(_TB, "save", None)
        if save is not None:
            save(self)
        self._save_hparams()

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Scalars of ``metrics`` (tensors of one value included) at ``step`` (None: 0)."""
        values = {k: (v.item() if hasattr(v, "numel") and v.numel() == 1 else v) for k, v in metrics.items()}
        super().log_metrics(values, 0 if step is None else step)

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Add ``model``'s graph traced on ``input_array`` (default ``model.example_input_array``) when the logger
        was made with ``log_graph=True``; a missing or untraceable input warns instead (Lightning's messages)."""
        import warnings

        if not self._log_graph:
            return
        input_array = getattr(model, "example_input_array", None) if input_array is None else input_array
        if input_array is None:
            warnings.warn("Could not log computational graph to TensorBoard: The `model.example_input_array` "
                          "attribute is not set or `input_array` was not given.", UserWarning, stacklevel=2)
        elif not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn("Could not log computational graph to TensorBoard: The `input_array` or "
                          f"`model.example_input_array` has type {type(input_array)} which can't be traced by "
                          "TensorBoard. Make the input array a tuple representing the positional arguments to the "
                          "model's `forward()` implementation.", UserWarning, stacklevel=2)
        else:
            # torch.jit reads every attribute: a module's trainer/fit then reads None instead of raising (what
            # Lightning's _jit_is_scripting does; set here directly, the module's package sits above this one)
            flagged = [m for m in model.modules() if hasattr(type(m), "_jit_is_scripting")]
            for m in flagged:
                object.__setattr__(m, "_jit_is_scripting", True)
            try:
                self.experiment.add_graph(model, input_array)
            finally:
                for m in flagged:
                    object.__setattr__(m, "_jit_is_scripting", False)


def _flatten(params: dict[str, Any], parent: str = "") -> dict[str, Any]:
    """Nested dicts (and ``argparse.Namespace``) as ``a/b`` keys (Lightning's ``_flatten_dict``)."""
    import argparse

    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{parent}/{k}" if parent else str(k)
        v = vars(v) if isinstance(v, argparse.Namespace) else v
        out.update(_flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


class MLFlowLogger(_MLFlow):
    """MLflow run (Lightning's ``MLFlowLogger(experiment_name="lightning_logs", run_name=None, tracking_uri=None,
    ..., save_dir="./mlruns")``): ``run_name`` names the run, files go to ``save_dir``."""

    def __init__(self, experiment_name: str = "lightning_logs", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict | None = None, save_dir: str | None = "./mlruns",
                 **kwargs: Any) -> None:
        super().__init__(save_dir or "./mlruns", experiment_name=experiment_name, run_name=run_name)


class WandbLogger(_Wandb):
    """W&B run (Lightning's ``WandbLogger(name=None, save_dir=".", version=None, offline=False, ..., project=None)``):
    ``name`` names the run, files go to ``save_dir``."""

    def __init__(self, name: str | None = None, save_dir: str = ".", version: str | None = None,
                 offline: bool = False, dir: str | None = None, id: str | None = None, anonymous: bool | None = None,
                 project: str | None = None, log_model: Any = False, **kwargs: Any) -> None:
        super().__init__(dir or save_dir, project=project, run_name=name)
