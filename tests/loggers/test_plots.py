"""F-OBS-3: training curves as PNG at the end of fit (next to metrics.csv) and ``taskfit plot RUN_DIR``."""

from __future__ import annotations

import os

import pytest
from taskfit import Fit
from taskfit.cli.app import main as cli_main
from taskfit.loggers.plots import PNG_NAME, curve_names, panels, plot_history, read_metrics_csv

from logger_test_model import Regression, regression_data

_data = regression_data


@pytest.fixture
def run_dir(tmp_path):
    fit = Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to="csv", save_strategy="no", max_steps=8,
              logging_steps=2, eval_strategy="steps", eval_steps=4, per_device_train_batch_size=2,
              learning_rate=0.05, lr_scheduler_type="linear")
    fit.fit(Regression(), _data(16), _data(8, 1))
    return tmp_path, fit


def test_png_written_at_end_of_fit_F_OBS_3(run_dir):
    """F-OBS-3: after fit, ``logs/training_curves.png`` holds one panel per logged quantity (loss with
    eval_loss, learning_rate, grad_norm, mae: 4 panels -> 3 columns x 2 rows of 420x300 px); the drawn data are
    the CSV rows."""
    from matplotlib.image import imread

    tmp_path, fit = run_dir
    png = tmp_path / "logs" / PNG_NAME
    assert fit.loggers[0].plot_path == str(png) and png.is_file()
    rows = read_metrics_csv(str(tmp_path / "logs" / "metrics.csv"))
    assert panels(rows) == [("loss", ["loss", "eval_loss"]), ("learning_rate", ["learning_rate"]),
                            ("grad_norm", ["grad_norm"]), ("mae", ["eval_mae"])]
    assert curve_names(rows) == ["loss", "eval_loss", "learning_rate", "grad_norm", "eval_mae"]
    assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6, 8]
    assert [r["learning_rate"] for r in rows if "learning_rate" in r] == pytest.approx(  # the rate each step used (HF 5)
        [0.04375, 0.03125, 0.01875, 0.00625])
    image = imread(str(png))
    assert image.shape[:2] == (600, 1260)
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_taskfit_plot_redraws_from_the_csv_F_OBS_3(run_dir, capsys):
    """F-OBS-3: ``taskfit plot RUN_DIR`` (output_dir or logging_dir) redraws the same PNG from metrics.csv;
    ``--output`` picks the file; a folder without metrics.csv exits 2 naming the paths tried."""
    tmp_path, _ = run_dir
    png = tmp_path / "logs" / PNG_NAME
    first = png.read_bytes()
    png.unlink()
    assert cli_main(["plot", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes() == first  # same data, same drawing
    other = tmp_path / "other.png"
    assert cli_main(["plot", str(tmp_path / "logs"), "--output", str(other)]) == 0 and other.is_file()
    assert cli_main(["plot", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "No metrics.csv" in err and os.path.join("nowhere", "logs", "metrics.csv") in err


def test_plot_history_rejects_rows_without_curves_F_OBS_3(tmp_path):
    """F-OBS-3: speed columns are not curves; rows with nothing to draw give a clear ValueError."""
    rows = [{"step": 1, "train_runtime": 3.0, "eval_samples_per_second": 9.0, "epoch": 1.0}]
    assert curve_names(rows) == []
    with pytest.raises(ValueError, match="Nothing to plot"):
        plot_history(rows, str(tmp_path / "x.png"))


def test_panels_pair_train_and_validation_skip_constants_and_early_test_F_OBS_6(tmp_path):
    """F-OBS-6: every logged scalar gets a curve; ``train_acc``/``val_acc`` and ``loss``/``eval_loss`` share a
    panel; a constant series is skipped; ``test_*`` points a ``fit.test()`` logged before training (step 0) are
    not mixed into the curves, a test after training is."""
    rows = [{"step": 0, "test_loss": 9.0, "test_acc": 0.1},
            {"step": 2, "loss": 1.0, "train_acc": 0.5, "learning_rate": 0.1, "my_metric": 3.0},
            {"step": 2, "eval_loss": 1.2, "val_acc": 0.4, "eval_runtime": 0.1, "epoch": 1.0},
            {"step": 4, "loss": 0.5, "train_acc": 0.7, "learning_rate": 0.1, "my_metric": 2.0},
            {"step": 4, "eval_loss": 0.9, "val_acc": 0.6, "eval_runtime": 0.2, "epoch": 2.0},
            {"step": 4, "test_loss": 0.8, "test_acc": 0.65}]
    assert panels(rows) == [("loss", ["loss", "eval_loss", "test_loss"]), ("acc", ["train_acc", "val_acc", "test_acc"]),
                            ("my_metric", ["my_metric"])]  # learning_rate is constant: skipped
    png = plot_history(rows, str(tmp_path / "c.png"))
    from matplotlib.image import imread

    assert imread(png).shape[:2] == (300, 1260)
