"""MLflow logger (``report_to="mlflow"``, extra ``mlflow``): a local SQLite store by default."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from taskfit.loggers.logger import Logger, flat_params, read_run_id, require, scalar_metrics, write_run_id

_STATUS = {"success": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
_BAD_KEY = re.compile(r"[^\w\-. /:]")


class MLFlowLogger(Logger):
    """Log to an MLflow tracking store through ``MlflowClient``: parameters once, metrics with their
    ``global_step`` as the MLflow step, the end-of-run summary as ``summary/<name>`` metrics, and the run
    status at the end. Mirrors HF's ``MLflowCallback`` (environment variables ``MLFLOW_TRACKING_URI``,
    ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID``) and Lightning's ``MLFlowLogger``.

    The run id is recorded in ``<save_dir>/.mlflow_run_id``; a run resumed from a checkpoint logs into that
    same MLflow run (points the stopped run logged after the checkpoint stay in its metric history: MLflow
    cannot delete them).

    Args:
        save_dir (str): logging folder; the default store is the SQLite database ``<save_dir>/mlflow.db``
            (``sqlite:///...``), which every current MLflow reads: ``mlflow.search_runs`` /
            ``mlflow ui --backend-store-uri sqlite:///<save_dir>/mlflow.db``.
        experiment_name (str | None): MLflow experiment (created when missing); default
            ``$MLFLOW_EXPERIMENT_NAME`` or ``"taskfit"``.
        run_name (str | None): the run's name.
        tracking_uri (str | None): store URI; default ``$MLFLOW_TRACKING_URI`` or the file store above.
        tags (dict[str, str] | None): run tags.

    Attributes:
        run_id (str | None): the MLflow run id once the run exists.

    Raises:
        ModuleNotFoundError: ``mlflow`` is not installed (extra ``mlflow``); raised at construction.
    """

    name = "mlflow"

    def __init__(self, save_dir: str, experiment_name: str | None = None, run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, str] | None = None) -> None:
        require("mlflow", "mlflow", "MLFlowLogger (report_to='mlflow')")
        self.save_dir = save_dir
        self.experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "taskfit"
        self.run_name = run_name
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self.tracking_uri = uri or "sqlite:///" + os.path.abspath(os.path.join(save_dir, "mlflow.db"))
        self.tags = dict(tags or {})
        self.run_id: str | None = os.environ.get("MLFLOW_RUN_ID") or None
        self._client: Any = None
        self._resumed = False

    @property
    def experiment(self) -> Any:
        """The ``MlflowClient``; the experiment and run are created on first use (rank zero only)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            if self.tracking_uri.startswith("file:"):  # MLflow 3 keeps the file store behind this opt-in
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            if self.tracking_uri.startswith("sqlite:"):
                os.makedirs(os.path.dirname(self.tracking_uri[len("sqlite:///"):]) or ".", exist_ok=True)
            client = MlflowClient(tracking_uri=self.tracking_uri)
            if self.run_id is None:
                exp = client.get_experiment_by_name(self.experiment_name)
                exp_id = exp.experiment_id if exp is not None else client.create_experiment(self.experiment_name)
                run = client.create_run(exp_id, run_name=self.run_name, tags=self.tags)
                self.run_id = run.info.run_id
                write_run_id(self.save_dir, "mlflow", self.run_id)
            elif self._resumed:
                client.update_run(self.run_id, status="RUNNING")
            self._client = client
        return self._client

    def resume(self, step: int, log_history: list[dict[str, Any]]) -> None:
        """Log into the run recorded in ``save_dir`` (unless ``$MLFLOW_RUN_ID`` names one)."""
        if self._client is None and self.run_id is None:
            self.run_id = read_run_id(self.save_dir, "mlflow")
        self._resumed = self.run_id is not None

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        client = self.experiment
        # a resumed run may differ in a few options (e.g. resume_from_checkpoint); MLflow refuses to change a param
        known = client.get_run(self.run_id).data.params if self._resumed else {}
        items = [Param(_BAD_KEY.sub("_", k), str(v)) for k, v in flat_params(params).items()
                 if _BAD_KEY.sub("_", k) not in known]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        client = self.experiment
        now = int(time.time() * 1000)
        items = [Metric(_BAD_KEY.sub("_", k), v, now, step) for k, v in scalar_metrics(metrics).items()]
        if items:
            client.log_batch(self.run_id, metrics=items)

    def finalize(self, status: str) -> None:
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id, _STATUS.get(status, "FINISHED"))
