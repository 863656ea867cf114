"""F-OBS-5: what a default run shows on the console, captured from real processes that configure no logging:
the start summary and every evaluation's metrics on the main process, ``log_level`` obeyed without
``logging.basicConfig``, nothing printed twice when the application set up logging, one copy under DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(__file__), "console_job.py")


def _console(tmp_path, **options) -> tuple[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, JOB, json.dumps({"output_dir": str(tmp_path / "out"), **options})],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def _eval_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "'val_mae'" in line and "'eval_runtime'" in line]


def test_F_OBS_5_default_run_shows_summary_and_every_evaluation_in_the_bar_mode(tmp_path):
    out, err = _console(tmp_path)  # the progress bar is on by default
    assert err.count("taskfit run summary") == 1
    assert "strategy        : single_device" in err and "memory estimate" in err and "batch" in err
    assert len(_eval_lines(out)) == 2  # evaluations at steps 3 and 6: one line each above the bar
    assert "val_mae=" in err  # and in the bar's postfix


def test_F_OBS_5_bar_off_prints_one_line_per_log(tmp_path):
    out, err = _console(tmp_path, disable_tqdm=True)
    lines = [eval(line) for line in out.splitlines() if line.startswith("{")]  # noqa: S307  dict literals
    assert [sorted(d)[:2] for d in lines if "loss" in d] == [["epoch", "grad_norm"]] * 3  # steps 2, 4, 6
    assert len(_eval_lines(out)) == 2
    assert "train_runtime" in lines[-1] and err.count("taskfit run summary") == 1


def test_F_OBS_5_log_level_without_basic_config(tmp_path):
    _, err = _console(tmp_path, log_level="warning", disable_tqdm=True)
    assert "taskfit run summary" not in err
    _, err = _console(tmp_path, log_level="debug", disable_tqdm=True)
    assert "taskfit run summary" in err


def test_F_OBS_5_application_logging_set_up_prints_once(tmp_path):
    _, err = _console(tmp_path, basic_config=True, disable_tqdm=True)
    assert err.count("taskfit run summary") == 1 and "APP taskfit taskfit run summary" in err


@pytest.mark.distributed
def test_F_OBS_5_ddp_two_processes_print_one_copy(tmp_path):
    out, err = _console(tmp_path, strategy="ddp", devices=2, disable_tqdm=True)
    assert err.count("taskfit run summary") == 1 and "ddp, 2 process(es)" in err
    assert len(_eval_lines(out)) == 2 and out.count("train_runtime") == 1
