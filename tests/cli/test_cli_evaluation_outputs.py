"""What ``taskfit validate|test|predict`` leave on disk (issue 31): an evaluation outside ``fit`` never writes into
the training run's ``metrics.csv`` (it gets its own folder, keyed by the checkpoint it scored), so ``taskfit plot``
draws the training curves unchanged; ``taskfit predict`` writes its predictions and metrics into ``output_dir`` and
says where."""

from __future__ import annotations

import csv
import json

import pytest
from test_cli_runs import _cli, _project, _result


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained_csv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_eval")
    proj = _project(tmp)
    with open(proj / "my_task.py", "a") as f:  # predict's default step calls forward
        f.write("\n\nNet.forward = lambda self, x: self.net(x).squeeze(-1)\n")
    _cli(proj, "fit", "--config", "run.yaml", "--report_to", "csv")
    return tmp, proj


def test_evaluations_outside_fit_keep_the_training_log_unchanged(trained_csv):
    from taskfit.loggers.plots import panels, read_metrics_csv

    tmp, proj = trained_csv
    log = tmp / "out" / "logs" / "metrics.csv"
    before = log.read_text()
    steps = [int(float(r["step"])) for r in _rows(log)]
    assert steps == sorted(steps) and steps[-1] == 16
    drawn_before = panels(read_metrics_csv(str(log)))
    _cli(proj, "validate", "--config", "run.yaml", "--report_to", "csv", "--ckpt_path", "last")
    _cli(proj, "test", "--config", "run.yaml", "--report_to", "csv", "--ckpt_path", "best")
    assert log.read_text() == before  # no step-0 rows appended to the training run
    # each evaluation has its own folder, named after the command and the checkpoint it scored
    own = tmp / "out" / "logs" / "validate-checkpoint-16" / "metrics.csv"
    assert own.is_file() and any("eval_loss" in r and r["eval_loss"] for r in _rows(own))
    assert (tmp / "out" / "logs" / "test-checkpoint-16" / "metrics.csv").is_file() or \
        (tmp / "out" / "logs" / "test-checkpoint-8" / "metrics.csv").is_file()
    proc = _cli(proj, "plot", str(tmp / "out"))
    assert proc.stdout.strip().endswith("training_curves.png")
    assert panels(read_metrics_csv(str(log))) == drawn_before


def test_plot_leaves_out_rows_an_old_evaluation_appended_at_step_0(tmp_path):
    """A metrics.csv written by the earlier CLI (evaluation rows at step 0 appended after training) draws the
    training curves only: no point back at step 0, no ``model_preparation_time`` panel."""
    from taskfit.loggers.plots import _series, panels, read_metrics_csv

    path = tmp_path / "metrics.csv"
    lines = ["step,loss,eval_loss,eval_model_preparation_time,test_loss",
             "64,1.0,,,", "64,,0.9,,", "128,0.8,,,", "128,,0.7,,", "192,0.6,,,", "192,,0.5,,",
             "0,,0.5,0.013,", "0,,,0.011,0.5"]
    path.write_text("\n".join(lines) + "\n")
    rows = read_metrics_csv(str(path))
    drawn = dict(panels(rows))
    assert set(drawn) == {"loss"} and drawn["loss"] == ["loss", "eval_loss"]
    assert [x for x, _ in _series(rows, "eval_loss")] == [64, 128, 192]


def test_predict_writes_predictions_and_metrics_and_says_where(trained_csv):
    import torch

    tmp, proj = trained_csv
    proc = _cli(proj, "predict", "--config", "run.yaml", "--ckpt_path", "last")
    out = tmp / "out" / "predict-checkpoint-16"
    saved = torch.load(out / "predictions.pt", weights_only=True)
    assert saved["predictions"].shape[0] == 64
    metrics = json.loads((out / "predict_results.json").read_text())
    assert metrics == _result(proc)
    assert str(out / "predictions.pt") in proc.stdout
