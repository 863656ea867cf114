"""Loggers with Lightning's constructor arguments (``save_dir, name="lightning_logs", version=None, ...``): each
writes under ``save_dir/name/version_N`` (the next free N, as Lightning's) through the taskfit logger of the same
kind. Mirrors ``lightning.pytorch.loggers.CSVLogger`` / ``TensorBoardLogger`` / ``MLFlowLogger`` /
``WandbLogger``; ``taskfit.lightning.loggers`` exports them under those names."""

from __future__ import annotations

import os
from typing import Any

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


class _Versioned:
    """``name``, ``version``, ``root_dir`` and ``log_dir`` as Lightning's file loggers have them."""

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
        """``save_dir/name``."""
        return os.path.join(self._root_save_dir, self._name)

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

    @property
    def experiment(self) -> Any:
        """The object that writes (this logger: ``log_metrics``/``log_hyperparams``/``save``, ``metrics``,
        ``metrics_file_path``), as Lightning's ``logger.experiment``."""
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
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        super().log_metrics(values, len(self._pending) if step is None else step)

    def log_hyperparams(self, params: Any = None, *args: Any, **kwargs: Any) -> None:
        """Write ``hparams.yaml`` (an ``argparse.Namespace`` or a dict; None: an empty file), leaving out with a
        warning a value YAML cannot write, as Lightning's ``save_hparams_to_yaml``."""
        import argparse
        import warnings

        import yaml

        params = vars(params) if isinstance(params, argparse.Namespace) else dict(params or {})
        kept = {}
        for k, v in params.items():
            try:
                yaml.dump(v)
                kept[k] = v
            except (TypeError, ValueError):
                warnings.warn(f"Skipping '{k}' parameter because it is not possible to safely dump to YAML.",
                              stacklevel=2)  # Lightning's words
        self._fs.makedirs(self.save_dir, exist_ok=True)
        with self._fs.open(f"{self.save_dir}/hparams.yaml", "w") as f:
            yaml.dump(kept, f)


class TensorBoardLogger(_Versioned, _TB):
    """TensorBoard events under ``save_dir/name/version_N`` (Lightning's ``TensorBoardLogger(save_dir, name,
    version, log_graph, default_hp_metric, prefix, sub_dir)``; ``log_graph`` and ``sub_dir`` are refused).

    Raises:
        NotImplementedError: ``log_graph=True``, ``sub_dir`` or a ``prefix``. ModuleNotFoundError: no tensorboard.
    """

    def __init__(self, save_dir: Any, name: str | None = "lightning_logs", version: int | str | None = None,
                 log_graph: bool = False, default_hp_metric: bool = True, prefix: str = "",
                 sub_dir: Any = None, **kwargs: Any) -> None:
        if log_graph or sub_dir is not None:
            raise NotImplementedError("TensorBoardLogger: log_graph and sub_dir are not supported.")
        _TB.__init__(self, self._place(save_dir, name, version, prefix), **kwargs)


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
