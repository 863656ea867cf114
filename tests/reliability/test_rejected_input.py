"""Bad input is refused before any work with a message naming the option, the value and what is valid (F-REL-5,
F-REL-3): non-finite numbers, out-of-range seeds, non-numeric ``optim_args``, a directory as ``--config``, a
file as the checkpoint to resume from, an optimizer over parameters that are not the model's; a missing
``fsdp_config`` file while FSDP is unused is a warning."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from proc import clean_env

from taskfit import Fit, FitArguments
from taskfit.checkpoint.writer import CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


@pytest.mark.parametrize("name", ["learning_rate", "weight_decay", "adam_epsilon", "num_train_epochs",
                                  "max_grad_norm", "warmup_ratio"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf", "nan", float("-inf")])
def test_F_REL_5_non_finite_float_options_are_refused(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be a finite number, got '?-?(inf|nan)"):
        FitArguments(output_dir="o", **{name: value})


@pytest.mark.parametrize("name", ["logging_steps", "save_steps", "eval_steps", "max_steps"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_F_REL_5_non_finite_step_options_are_refused_not_crashing(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be (a finite number|int), got (inf|nan)"):
        FitArguments(output_dir="o", **{name: value})


@pytest.mark.parametrize("name", ["seed", "data_seed"])
@pytest.mark.parametrize("value", [2**70, -1, 2**32])
def test_F_REL_5_seed_out_of_range_is_refused(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be an integer in \[0, 2\*\*32 - 1\].*got {value}"):
        FitArguments(output_dir="o", **{name: value})


@pytest.mark.parametrize("text,match", [("lr=abc", r"optim_args lr='abc'.*not a number"),
                                        ("lr=0.1,eps=nope", r"optim_args eps='nope'.*not a number"),
                                        ("lr=NaN", r"optim_args lr=nan.*finite")])
def test_F_REL_5_non_numeric_optim_args_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        FitArguments(output_dir="o", optim_args=text)
    assert FitArguments(output_dir="o", optim_args="lr=0.01,foreach=false").optim_args == {"lr": 0.01,
                                                                                           "foreach": False}


def test_F_REL_5_config_directory_is_refused_by_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "taskfit.cli.app", "fit", "--config", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 2 and "is a directory; give the path of a YAML or JSON file" in proc.stderr
    assert str(tmp_path) in proc.stderr


def test_F_REL_3_resume_from_a_file_path_names_the_problem(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    fit = Fit(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", disable_tqdm=True)
    torch.manual_seed(0)
    with pytest.raises(CheckpointError, match=r"model\.safetensors' is not a checkpoint folder"):
        fit.fit(job.Net(), job.data(), resume_from_checkpoint=str(f))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("checkpoint-*"))


def test_F_REL_5_optimizer_over_foreign_parameters_is_refused(tmp_path):
    other = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    fit = Fit(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", disable_tqdm=True,
              optimizers=(opt, None))
    torch.manual_seed(0)
    module = job.Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match=r"not in the model Net: param_groups\[0\]\['params'\]\[0\] of shape \(3, 3\)"):
        fit.fit(module, job.data())
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # refused before any step


def test_F_REL_5_missing_fsdp_config_file_warns_when_fsdp_is_unused(tmp_path, caplog):
    missing = str(tmp_path / "fsdp.json")
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        FitArguments(output_dir="o", fsdp_config=missing)
    assert f"fsdp_config={missing!r}: no such file; ignored because FSDP is not used" in caplog.text
    with pytest.raises(FileNotFoundError, match="does not exist"):  # used: an error before any work
        Fit(output_dir=str(tmp_path / "o"), fsdp_config=missing, fsdp="full_shard", strategy="fsdp",
            report_to="none").fit(job.Net(), job.data())
