"""F-OBS-6: logs continue across a resume in every logger. A real run (csv, tensorboard, mlflow, wandb offline)
is SIGKILLed after step 11 (its newest checkpoint is step 8, its loggers already hold steps 9 and 10), resumed
in a new process, and every logger's output is read back with its own reader and compared with an uninterrupted
run: the CSV rows, TensorBoard scalars (one point per step, none stale), the same MLflow run, the same W&B run id,
and the end-of-run plot over the whole run."""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from test_loggers import _wandb_records

JOB = os.path.join(os.path.dirname(__file__), "resume_job.py")
SPEED = ("_runtime", "_per_second")


def _run(out: str, kill: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    # WANDB_SERVICE: set by an earlier in-process wandb test; sharing that wandb-core keeps a killed run "in use"
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_RUN_ID",
                "MLFLOW_ALLOW_FILE_STORE", "WANDB_SERVICE"):
        env.pop(var, None)
    # MLflow's file store: the default SQLite store (read back in test_loggers.py) costs each process about 2 CPU-s
    # of schema migrations; resuming into the same run does not depend on the store
    env["MLFLOW_TRACKING_URI"] = _mlflow_uri(out)
    proc = subprocess.run([sys.executable, JOB, out] + ([str(kill)] if kill else []), env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == (-9 if kill else 0), proc.stderr[-3000:]
    return proc


def _mlflow_uri(out: str) -> str:
    return "file://" + os.path.join(out, "logs", "mlruns")


def _csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v and not k.endswith(SPEED)} for row in csv.DictReader(f)]


def _tb(folder: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if not tag.endswith(("runtime", "per_second")) and not tag.startswith("summary/")}


def _wandb_history(run_dir: str, finished: bool = True) -> tuple[str, dict[int, dict]]:
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    deadline = time.monotonic() + 60
    records = _wandb_records(path)
    while finished and not any(r.WhichOneof("record_type") == "exit" for r in records):  # written asynchronously
        assert time.monotonic() < deadline, "no exit record"
        time.sleep(0.2)
        records = _wandb_records(path)
    history: dict[int, dict] = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(rec.history.step.num, {}).update(row)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return run.run_id, history


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume_logs")
    ref, resumed = str(base / "ref"), str(base / "resumed")
    _run(ref)
    _run(resumed, kill=11)
    before = {"csv": _csv(os.path.join(resumed, "logs", "metrics.csv")),
              "tb": _tb(os.path.join(resumed, "logs"))}
    proc = _run(resumed)
    return ref, resumed, before, proc


def test_F_OBS_6_csv_rows_kept_and_stale_rows_dropped(runs):
    ref, resumed, before, _ = runs
    assert [int(r["step"]) for r in before["csv"]][-2:] == [9, 10]  # the killed run logged past checkpoint-8
    got, want = _csv(os.path.join(resumed, "logs", "metrics.csv")), _csv(os.path.join(ref, "logs", "metrics.csv"))
    assert [int(r["step"]) for r in got] == [2, 3, 4, 6, 6, 8, 9, 10, 12, 12]
    assert got == want  # every row of the uninterrupted run, once, with the same values


def test_F_OBS_6_tensorboard_continues_without_duplicates(runs):
    ref, resumed, before, _ = runs
    assert [s for s, _ in before["tb"]["train/loss"]] == [2, 4, 6, 8, 10]
    got, want = _tb(os.path.join(resumed, "logs")), _tb(os.path.join(ref, "logs"))
    assert set(got) == set(want) and "train/train_loss" in got and "eval/loss" in got
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag  # one point per step, in order
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


def test_F_OBS_6_mlflow_logs_into_the_same_run(runs, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    ref, resumed, _, _ = runs
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store behind this opt-in
    uri = _mlflow_uri(resumed)
    mlflow.set_tracking_uri(uri)
    try:
        found = mlflow.search_runs(experiment_names=["taskfit"], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    assert len(found) == 1 and found[0].info.status == "FINISHED"
    run = found[0]
    assert run.info.run_name == "resumed-run" and run.data.params["max_steps"] == "12"
    ref_client = MlflowClient(_mlflow_uri(ref))
    (ref_run,) = ref_client.search_runs([ref_client.get_experiment_by_name("taskfit").experiment_id])
    client = MlflowClient(uri)
    for key in ("loss", "train_loss", "eval_loss", "val_mae"):
        want = {(m.step, m.value) for m in ref_client.get_metric_history(ref_run.info.run_id, key)}
        got = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)}
        assert got == want, key  # steps before and after the resume, in one run
    assert run.data.metrics["summary/train_loss"] == pytest.approx(ref_run.data.metrics["summary/train_loss"])


def test_F_OBS_6_wandb_resumes_its_run(runs):
    """Offline, the resumed part is a second run folder with the same run id (``wandb sync`` merges them); it
    holds the steps after the checkpoint with the uninterrupted run's values. (The killed part's own log may be
    cut short: W&B's writer dies with the process.)"""
    ref, resumed, _, _ = runs
    folders = sorted(glob.glob(os.path.join(resumed, "logs", "wandb", "offline-run-*")))
    assert len(folders) == 2
    run_id, second = _wandb_history(folders[1])
    assert all(f.endswith("-" + run_id) for f in folders)  # both parts belong to one W&B run
    with open(os.path.join(resumed, "logs", ".wandb_run_id")) as f:
        assert f.read() == run_id
    (_, want), = [_wandb_history(f) for f in glob.glob(os.path.join(ref, "logs", "wandb", "offline-run-*"))]
    for key in ("loss", "eval_loss", "train_loss"):
        got = {s: r[key] for s, r in second.items() if key in r}
        assert min(got) > 8 and got == pytest.approx({s: r[key] for s, r in want.items() if key in r and s > 8},
                                                     rel=1e-9), key


def test_F_OBS_6_plot_covers_the_whole_run(runs):
    from taskfit.loggers.plots import panels, read_metrics_csv

    _, resumed, _, proc = runs
    rows = read_metrics_csv(os.path.join(resumed, "logs", "metrics.csv"))
    drawn = dict(panels(rows))
    assert drawn["loss"] == ["loss", "train_loss", "eval_loss"]
    assert sorted({r["step"] for r in rows if "loss" in r}) == [2, 4, 6, 8, 10, 12]
    assert os.path.getmtime(os.path.join(resumed, "logs", "training_curves.png")) > 0
    assert "Resuming from" in proc.stderr and "checkpoint-8" in proc.stderr  # visible without logging set-up
