"""F-OBS-2: loggers by name (``report_to``) and as objects. Each logger writes a real run that its own reader
loads back (TensorBoard's EventAccumulator, the MLflow client on the file store, the W&B offline transaction
log), with the right metric values at the right global steps; hyperparameters once; nothing from rank > 0."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import time

import pytest
from taskfit import Fit, FitArguments
from taskfit.loggers import LOGGERS, CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger, build_loggers

from logger_test_model import Regression, regression_data

_data = regression_data


def _run(tmp_path, report_to, loggers=None, **kw):
    fit = Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to=report_to, save_strategy="no", max_steps=6,
              logging_steps=2, eval_strategy="steps", eval_steps=3, per_device_train_batch_size=2,
              per_device_eval_batch_size=4, learning_rate=0.05, run_name="demo-run", loggers=loggers, **kw)
    fit.fit(Regression(), _data(12), _data(8, 1))
    return fit


def _expected(fit, key):
    """``{step: value}`` of ``key`` in the run's log history (what every logger must have received)."""
    return {h["step"]: h[key] for h in fit.state.log_history if key in h}


# ------------------------------------------------------------------------------------------ tensorboard ---
def test_tensorboard_event_files_read_back_F_OBS_2(tmp_path):
    """F-OBS-2: ``report_to="tensorboard"`` writes event files under ``logging_dir``; EventAccumulator reads
    ``loss`` at steps 2/4/6, ``eval_loss``/``eval_mae`` at steps 3/6 with the logged values (grouped tags
    ``train/loss``, ``eval/loss``, ``eval/mae``, the end-of-run summary under ``summary/``), and the hparams."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fit = _run(tmp_path, "tensorboard")
    assert [type(lg) for lg in fit.loggers] == [TensorBoardLogger]
    acc = EventAccumulator(os.path.join(tmp_path, "logs"))
    acc.Reload()
    tags = {"loss": "train/loss", "eval_loss": "eval/loss", "eval_mae": "eval/mae", "learning_rate": "train/learning_rate"}
    for key, steps in (("loss", [2, 4, 6]), ("eval_loss", [3, 6]), ("eval_mae", [3, 6]), ("learning_rate", [2, 4, 6])):
        events = acc.Scalars(tags[key])
        assert [e.step for e in events] == steps
        want = _expected(fit, key)
        assert [e.value for e in events] == pytest.approx([want[s] for s in steps], rel=1e-6)
    assert [e.step for e in acc.Scalars("summary/train_loss")] == [6]
    assert not {"loss", "eval_loss", "train/train_loss"} & set(acc.Tags()["scalars"])
    text = acc.Tensors("hparams/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "learning_rate: 0.05" in text and "max_steps: 6" in text


# ----------------------------------------------------------------------------------------------- mlflow ---
def test_mlflow_sqlite_store_read_back_with_client_F_OBS_2(tmp_path, monkeypatch):
    """F-OBS-2: ``report_to="mlflow"`` logs to ``sqlite:///<logging_dir>/mlflow.db`` (no
    ``MLFLOW_ALLOW_FILE_STORE`` needed); MlflowClient reads the run back: its name, params (once), metric
    histories with the right steps and values, and status FINISHED."""
    from mlflow.tracking import MlflowClient

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(var, raising=False)
    fit = _run(tmp_path, "mlflow")
    (logger,) = fit.loggers
    assert isinstance(logger, MLFlowLogger) and logger.tracking_uri.startswith("sqlite:///")
    assert os.path.isfile(os.path.join(tmp_path, "logs", "mlflow.db"))
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    client = MlflowClient(tracking_uri=logger.tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.info.run_name == "demo-run" and run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.05" and run.data.params["max_steps"] == "6"
    for key in ("loss", "eval_loss", "eval_mae"):
        history = client.get_metric_history(logger.run_id, key)
        want = _expected(fit, key)
        assert {m.step: m.value for m in history} == pytest.approx(want, rel=1e-9)
        assert len(history) == len(want)


# ------------------------------------------------------------------------------------------------ wandb ---
def _wandb_records(path: str) -> list:
    """Records of a W&B ``.wandb`` transaction log (LevelDB-log framing: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = open(path, "rb").read()
    assert raw[:4] == b":W&B"
    block, pos, out, buf = 32768, 7, [], b""
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(raw):  # a record still being written
            break
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        buf = data if kind in (1, 2) else buf + data
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def test_wandb_offline_run_folder_F_OBS_2(tmp_path, monkeypatch):
    """F-OBS-2: ``report_to="wandb"`` runs offline (nothing leaves the machine) and writes
    ``logs/wandb/offline-run-*/run-*.wandb``; its history records hold the metrics at their steps, the run
    config holds the arguments, the exit record says success."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    fit = _run(tmp_path, "wandb")
    (logger,) = fit.loggers
    assert isinstance(logger, WandbLogger) and logger.mode == "offline"
    files = glob.glob(os.path.join(tmp_path, "logs", "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1
    deadline = time.monotonic() + 60  # wandb's core process writes the log asynchronously: wait for the exit record
    records = _wandb_records(files[0])
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "the W&B run log has no exit record after 60 s"
        time.sleep(0.2)
        records = _wandb_records(files[0])
    history: dict[int, dict] = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(rec.history.step.num, {}).update(row)
    for key in ("loss", "eval_loss", "eval_mae"):
        want = _expected(fit, key)
        assert {s: r[key] for s, r in history.items() if key in r} == pytest.approx(want, rel=1e-9)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert run.display_name == "demo-run" and config["learning_rate"] == 0.05 and config["max_steps"] == 6
    (exit_rec,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_rec.exit_code == 0


# ------------------------------------------------------------------------------------------ by name ---
def test_report_to_names_all_and_none_F_OBS_2(tmp_path):
    """F-OBS-2: names build the matching classes under ``logging_dir``; ``all`` means csv plus every installed
    logger, the default None csv only; ``none`` builds nothing; a given object replaces the built one of its
    class; an unknown name fails with the valid choices."""
    args = FitArguments(output_dir=str(tmp_path), report_to="all", logging_dir=str(tmp_path / "tb"))
    built = build_loggers(args)
    assert [lg.name for lg in built] == ["csv", "tensorboard", "mlflow", "wandb"]  # all installed here
    assert built[0].save_dir == str(tmp_path / "tb") and built[1].save_dir == str(tmp_path / "tb")
    assert FitArguments().report_to == ["csv"]
    assert build_loggers(FitArguments(report_to="none")) == []
    mine = CSVLogger(str(tmp_path / "mine"))
    both = build_loggers(FitArguments(report_to=["csv", "tensorboard"]), [mine])
    assert both[0] is mine and [type(lg) for lg in both] == [CSVLogger, TensorBoardLogger]
    with pytest.raises(ValueError, match="report_to logger 'tensorbord'.*tensorboard"):
        FitArguments(report_to="tensorbord")
    with pytest.raises(TypeError, match="loggers must be Logger objects.*got str"):
        Fit(report_to="none", loggers=["csv"])
    assert set(LOGGERS) == {"csv", "tensorboard", "mlflow", "wandb"}


def test_logger_objects_and_several_at_once_F_OBS_2(tmp_path):
    """F-OBS-2: logger objects passed to ``Fit(loggers=...)`` get the same rows as named ones: a TensorBoard
    object in its own folder plus a CSV logger by name; both have ``loss`` at steps 2, 4, 6."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardLogger(str(tmp_path / "my_tb"))
    fit = _run(tmp_path, "csv", loggers=[tb])
    assert fit.loggers[0] is tb and isinstance(fit.loggers[1], CSVLogger)
    acc = EventAccumulator(str(tmp_path / "my_tb"))
    acc.Reload()
    with open(tmp_path / "logs" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["loss"]]
    assert [int(r["step"]) for r in rows] == [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6]
    assert [float(r["loss"]) for r in rows] == pytest.approx([e.value for e in acc.Scalars("train/loss")], rel=1e-6)


def test_missing_logger_package_names_the_extra_F_OBS_2(monkeypatch):
    """F-OBS-2: a logger whose package is absent fails at construction, naming the extra to install."""
    import taskfit.loggers.logger as base

    class Missing:
        def __init__(self, module):
            self.module = module

        def __bool__(self):
            return False

    monkeypatch.setattr(base, "RequirementCache", Missing)
    for cls, extra in ((TensorBoardLogger, "tensorboard"), (MLFlowLogger, "mlflow"), (WandbLogger, "wandb")):
        with pytest.raises(ModuleNotFoundError, match=rf"pip install 'taskfit\[{extra}\]'"):
            cls("x")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="mode='cloud' is not valid.*offline"):
        WandbLogger("x", mode="cloud")


# --------------------------------------------------------------------------------- name collisions ---
def test_user_train_loss_and_run_summary_keep_apart_F_OBS_6(tmp_path):
    """F-OBS-6: a user's per-step ``self.log("train_loss")`` keeps its name and only its own values in every
    logger; the end-of-run mean ``train_loss`` goes to ``summary.json`` (CSV) and ``summary/train_loss``
    (TensorBoard), so the curve does not jump at the last step; TensorBoard tags are grouped."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch import nn

    class UserLoss(Regression):
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.layer(x).squeeze(-1), y)
            self.log("train_loss", loss * 100)  # deliberately far from the run's mean loss
            return loss

    fit = Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to=["csv", "tensorboard"], save_strategy="no",
              max_steps=6, logging_steps=2, per_device_train_batch_size=2, learning_rate=0.05)
    out = fit.fit(UserLoss(), _data(12))
    user = {h["step"]: h["train_loss"] for h in fit.state.log_history if "loss" in h}
    assert sorted(user) == [2, 4, 6]
    with open(tmp_path / "logs" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["step"]): float(r["train_loss"]) for r in rows if r["train_loss"]} == pytest.approx(user)
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["train_loss"] == pytest.approx(out.training_loss) and summary["step"] == 6
    acc = EventAccumulator(str(tmp_path / "logs"))
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("train/train_loss")} == pytest.approx(user, rel=1e-6)
    assert [(e.step, e.value) for e in acc.Scalars("summary/train_loss")] == [(6, pytest.approx(out.training_loss))]


def test_csv_rows_of_an_earlier_process_survive_an_evaluation_before_the_resume_F_OBS_6(tmp_path):
    """F-OBS-6: a script that evaluates before resuming (``fit.test`` then ``fit.fit(resume_from_checkpoint=True)``,
    as the demo does) keeps the stopped run's rows: its first row has new columns, and that rewrite of
    ``metrics.csv`` used to hold only the new process's rows. The stopped run logged steps 1-6 (checkpoint at 3,
    the newer one gone): after the resume every step 1-6 has exactly one loss row, the test rows are both there."""
    import shutil

    def fit_():
        args = FitArguments(output_dir=str(tmp_path), max_steps=6, logging_steps=1, save_strategy="steps",
                            save_steps=3, report_to="csv", disable_tqdm=True, per_device_train_batch_size=2,
                            per_device_eval_batch_size=4, seed=0)
        return Fit(args)

    first = fit_()
    first.test(Regression(), regression_data(8))
    first.fit(Regression(), regression_data(12))
    shutil.rmtree(tmp_path / "checkpoint-6")  # the run stopped after step 6, before its last checkpoint completed
    second = fit_()
    second.test(Regression(), regression_data(8))
    second.fit(Regression(), regression_data(12), resume_from_checkpoint=True)
    with open(tmp_path / "logs" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows if r.get("loss")] == [1, 2, 3, 4, 5, 6]
    assert len([r for r in rows if r.get("test_loss")]) == 2
