"""F-CORE-6: the ``taskfit`` command line (``taskfit fit|validate|test|predict --config run.yaml ...``)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import fields
from typing import ClassVar

import pytest

from taskfit.__about__ import __version__
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.cli.app import build_arguments, build_parser, main


def write_config(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# Parsing into FitArguments


def test_flags_parse_into_fit_arguments():
    """F-CORE-6: typed flags (ints, floats, bools, lists, JSON dicts, null) become FitArguments values."""
    args, extra = build_arguments([
        "fit", "--max_steps", "3", "--learning_rate", "1e-3", "--bf16", "--logging_first_step", "false",
        "--report_to", "none", "--label_names", "labels", "mask", "--devices", "0", "1",
        "--lr_scheduler_kwargs", '{"num_cycles": 2}', "--warmup_ratio", "0.1", "--run_name", "null",
        "--eval_strategy", "steps", "--eval_steps", "0.5", "--resume_from_checkpoint", "--strategy", "ddp",
    ])
    assert isinstance(args, FitArguments)
    assert (args.max_steps, args.learning_rate, args.bf16, args.logging_first_step) == (3, 1e-3, True, False)
    assert (args.report_to, args.label_names, args.devices) == ([], ["labels", "mask"], [0, 1])
    assert (args.lr_scheduler_kwargs, args.warmup_steps, args.run_name) == ({"num_cycles": 2}, 0.1, None)  # 4.x warmup_ratio -> warmup_steps
    assert (args.eval_strategy, args.eval_steps, args.resume_from_checkpoint, args.strategy) == (
        "steps", 0.5, True, "ddp")
    assert extra == {"command": "fit", "config": None, "print_config": False, "module": None, "module_kwargs": {},
                     "data": None, "data_kwargs": {}, "datamodule": None, "datamodule_kwargs": {},
                     "ckpt_path": None}


def test_flag_spellings():
    """F-CORE-6: ``--flag=value``, dashed names, ``--devices auto``/``2`` and a checkpoint path."""
    args, _ = build_arguments(["fit", "--per-device-eval-batch-size=4", "--devices", "2", "--use_cpu", "true",
                               "--resume_from_checkpoint", "out/checkpoint-10", "--fsdp", "full_shard auto_wrap"])
    assert (args.per_device_eval_batch_size, args.devices, args.use_cpu) == (4, 2, True)
    assert (args.resume_from_checkpoint, args.fsdp) == ("out/checkpoint-10", ["full_shard", "auto_wrap"])
    assert build_arguments(["predict", "--devices", "auto"])[0].devices == "auto"


def test_every_option_is_a_flag():
    """F-CORE-6: the parser has one flag per FitArguments field, for every command."""
    parser = build_parser()
    for command, sub in parser.commands.items():
        dests = {action.dest for action in sub._actions}
        assert {f.name for f in fields(FitArguments)} <= dests, command


def test_config_then_flags_precedence(tmp_path):
    """F-CORE-6: defaults < config file < flags; non-option keys go to ``extra``; *_kwargs flags merge."""
    config = write_config(tmp_path, """\
        module: pkg.mod:Model
        module_kwargs: {hidden: 8, depth: 2}
        data: pkg.data:make
        learning_rate: 0.1
        max_steps: 10
        per_device_train_batch_size: 4
    """)
    args, extra = build_arguments(["fit", "--config", config, "--max_steps", "3",
                                   "--module_kwargs", '{"depth": 3}', "--data", "other.data:make"])
    assert (args.learning_rate, args.max_steps, args.per_device_train_batch_size, args.seed) == (0.1, 3, 4, 42)
    assert extra["module"] == "pkg.mod:Model" and extra["data"] == "other.data:make"
    assert extra["module_kwargs"] == {"hidden": 8, "depth": 3}
    assert extra["config"] == config and extra["command"] == "fit"


def test_json_config(tmp_path):
    """F-CORE-6: --config accepts JSON as well as YAML."""
    config = write_config(tmp_path, '{"max_steps": 5, "report_to": ["csv"], "datamodule": "x.y:DM"}', "run.json")
    args, extra = build_arguments(["validate", "--config", config])
    assert (args.max_steps, args.report_to, extra["datamodule"], extra["command"]) == (5, ["csv"], "x.y:DM", "validate")


def test_unknown_flag_exits_2_with_did_you_mean(capsys):
    """F-CORE-6: an unknown flag exits with status 2 and a "Did you mean"."""
    with pytest.raises(SystemExit) as err:
        build_arguments(["fit", "--lerning_rate", "3"])
    assert err.value.code == 2
    assert "unrecognized option '--lerning_rate'. Did you mean \"--learning_rate\"?" in capsys.readouterr().err


def test_unknown_config_key_exits_2_with_did_you_mean(tmp_path, capsys):
    """F-CORE-6: an unknown config key exits with status 2 and a "Did you mean" (options and module keys)."""
    for text, hint in (("max_step: 3\n", '"max_steps"'), ("modul: a.b:C\n", '"module"')):
        with pytest.raises(SystemExit) as err:
            build_arguments(["fit", "--config", write_config(tmp_path, text)])
        assert err.value.code == 2
        assert f"Did you mean {hint}?" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["fit", "--eval_strategy", "sometimes"], "Unknown eval_strategy 'sometimes'"),
    (["fit", "--max_steps", "many"], "FitArguments.max_steps must be int, got 'many'"),
    (["fit", "--module_kwargs", "[1]"], "expected a JSON object"),
    (["fit", "--config", "missing.yaml"], "Config file 'missing.yaml' does not exist"),
    (["fit", "stray"], "unrecognized argument 'stray'"),
    (["train"], "invalid choice: 'train'"),
])
def test_bad_values_exit_2(argv, message, capsys):
    """F-CORE-6: invalid values, files and commands exit with status 2 and name the problem."""
    with pytest.raises(SystemExit) as err:
        build_arguments(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_version_and_help(capsys):
    """F-CORE-6: ``taskfit --version`` and ``--help`` exit 0."""
    with pytest.raises(SystemExit) as err:
        main(["--version"])
    assert err.value.code == 0 and capsys.readouterr().out.strip() == f"taskfit {__version__}"
    with pytest.raises(SystemExit) as err:
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert err.value.code == 0 and "--per_device_train_batch_size" in out and "(default: 8)" in out


def test_help_does_not_import_torch():
    """F-CORE-6: the CLI imports the core lazily, so ``--help`` does not load torch."""
    code = "import sys, taskfit.cli.app; taskfit.cli.app.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_print_config(capsys, tmp_path):
    """F-CORE-6: --print_config prints the resolved YAML (tokens redacted), which loads back as a config."""
    assert main(["fit", "--module", "a.b:C", "--max_steps", "7", "--hub_token", "s3cret", "--print_config"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("module: a.b:C\n") and "max_steps: 7\n" in out and "s3cret" not in out
    args, extra = build_arguments(["fit", "--config", write_config(tmp_path, out), "--hub_token", "null"])
    assert args.max_steps == 7 and extra["module"] == "a.b:C"


# ---------------------------------------------------------------------------------------------------------------
# Running commands against the core API (``Fit(args=...)`` with fit/validate/test/predict)

TINY_TASK = '''
class Model:
    def __init__(self, hidden=2):
        self.hidden = hidden

def make_data(n=4):
    return {"train": list(range(n)), "eval": [10, 11], "test": [20], "data_collator": "collate"}

def only_eval():
    return {"eval": [1]}

def bad_keys():
    return {"training": [1]}

class DM:
    def __init__(self, size=1):
        self.size = size
'''


class RecordingFit:
    """Stand-in for ``taskfit.fit.fit.Fit`` recording how the CLI calls the core API."""

    calls: ClassVar[list] = []
    is_global_zero = True

    def __init__(self, args=None):
        self.args = args

    def _record(self, name, module, *data, **kwargs):
        RecordingFit.calls.append((name, self.args, module, data, kwargs))
        return {f"{name}_loss": 0.5, "steps": self.args.max_steps}

    def fit(self, module, *data, **kwargs):
        return self._record("fit", module, *data, **kwargs)

    def validate(self, module, *data, **kwargs):
        return self._record("validate", module, *data, **kwargs)

    def test(self, module, *data, **kwargs):
        return self._record("test", module, *data, **kwargs)

    def predict(self, module, *data, **kwargs):
        return types.SimpleNamespace(predictions=[1], metrics={"predict_runtime": 0.1})


@pytest.fixture
def recording_core(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config names no output_dir: HF's default folder lands here, not in the checkout
    (tmp_path / "cli_tiny_task.py").write_text(TINY_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cli_tiny_task", raising=False)
    monkeypatch.setitem(sys.modules, "taskfit.fit.fit", types.SimpleNamespace(Fit=RecordingFit))
    RecordingFit.calls = []
    return write_config(tmp_path, """\
        module: cli_tiny_task:Model
        module_kwargs: {hidden: 3}
        data: cli_tiny_task:make_data
        max_steps: 10
        report_to: none
    """)


def last_json_line(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_fit_command_calls_core_and_prints_metrics(recording_core, capsys):
    """F-CORE-6: ``fit`` builds module and data from the config and calls Fit(args).fit(module, train, eval,
    data_collator=...); the metrics are the last stdout line, as JSON."""
    assert main(["fit", "--config", recording_core, "--max_steps", "3"]) == 0
    assert last_json_line(capsys) == {"fit_loss": 0.5, "steps": 3}
    [(name, args, module, data, kwargs)] = RecordingFit.calls
    assert (name, args.max_steps, args.report_to, module.hidden) == ("fit", 3, [], 3)
    assert data == ([0, 1, 2, 3], [10, 11]) and kwargs == {"data_collator": "collate"}


@pytest.mark.parametrize("command, split, expected", [
    ("validate", [10, 11], {"validate_loss": 0.5, "steps": 10}),
    ("test", [20], {"test_loss": 0.5, "steps": 10}),
])
def test_validate_and_test_commands(recording_core, capsys, command, split, expected):
    """F-CORE-6: ``validate`` uses the 'eval' split, ``test`` the 'test' split."""
    assert main([command, "--config", recording_core]) == 0
    assert last_json_line(capsys) == expected
    [(name, _, _, data, kwargs)] = RecordingFit.calls
    assert (name, data, kwargs) == (command, (split,), {"data_collator": "collate"})


def test_predict_command_prints_metrics_attribute(recording_core, capsys):
    """F-CORE-6: ``predict`` falls back to the 'test' split; a result's ``.metrics`` is printed."""
    assert main(["predict", "--config", recording_core]) == 0
    assert last_json_line(capsys) == {"predict_runtime": 0.1}


def test_datamodule_command(recording_core, capsys, tmp_path):
    """F-CORE-6: ``datamodule:`` (with ``datamodule_kwargs``) passes a DataModule instance as ``datamodule=``."""
    config = write_config(tmp_path, """\
        module: cli_tiny_task:Model
        datamodule: cli_tiny_task:DM
        datamodule_kwargs: {size: 5}
        report_to: none
    """, "dm.yaml")
    assert main(["test", "--config", config]) == 0
    [(name, _, module, data, kwargs)] = RecordingFit.calls
    assert (name, data, module.hidden, kwargs["datamodule"].size) == ("test", (), 2, 5)
    assert last_json_line(capsys) == {"test_loss": 0.5, "steps": -1}


@pytest.mark.parametrize("extra_argv, message", [
    (["--module", "cli_tiny_task:Modle"], "has no attribute 'Modle' (from 'cli_tiny_task:Modle'). Did you mean \"Model\"?"),
    (["--module", "no_such_pkg.mod:Model"], "cannot import 'no_such_pkg.mod'"),
    (["--data", "cli_tiny_task:only_eval"], "'fit' needs data under 'train'"),
    (["--data", "cli_tiny_task:bad_keys"], "unknown data key 'training' from 'cli_tiny_task:bad_keys'. Did you mean \"train\"?"),
    (["--datamodule", "cli_tiny_task:DM"], "set either 'data' or 'datamodule', not both"),
])
def test_run_errors_exit_2_before_any_work(recording_core, capsys, extra_argv, message):
    """F-CORE-6: bad option values, bad import paths and missing data return 2 before the core is called."""
    assert main(["fit", "--config", recording_core, *extra_argv]) == 2
    assert message in capsys.readouterr().err
    assert RecordingFit.calls == []


# ---------------------------------------------------------------------------------------------------------------
# End to end with the real core

E2E_TASK = '''
import torch
from torch import nn


class TinyRegressor(nn.Module):
    """A plain model whose forward returns a loss, HF style."""

    def __init__(self, hidden=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x, labels=None):
        pred = self.net(x).squeeze(-1)
        out = {"logits": pred}
        if labels is not None:
            out["loss"] = nn.functional.mse_loss(pred, labels)
        return out


def make_data(n=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    rows = [{"x": x[i], "labels": x[i].sum()} for i in range(n)]
    return {"train": rows, "eval": rows[:8]}
'''


def test_cli_fit_end_to_end(tmp_path):
    """F-CORE-6: ``python -m taskfit.cli.app fit --config run.yaml --max_steps 3`` trains a real tiny model and prints
    its metrics as the last stdout line; ``validate`` reports ``eval_loss``."""
    if importlib.util.find_spec("taskfit.fit.fit") is None:
        pytest.skip("core Fit not landed yet")
    (tmp_path / "e2e_tiny_task.py").write_text(E2E_TASK)
    out_dir = tmp_path / "out"
    config = write_config(tmp_path, f"""\
        module: e2e_tiny_task:TinyRegressor
        module_kwargs: {{hidden: 4}}
        data: e2e_tiny_task:make_data
        output_dir: {out_dir}
        per_device_train_batch_size: 4
        logging_steps: 1
        save_strategy: "no"
        report_to: none
        use_cpu: true
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for command, extra in (("fit", ["--max_steps", "3"]), ("validate", [])):
        proc = subprocess.run([sys.executable, "-m", "taskfit.cli.app", command, "--config", config, *extra],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[command] = json.loads(proc.stdout.strip().splitlines()[-1])
    losses = {k: v for k, v in runs["fit"].items() if "loss" in k}
    assert losses and all(isinstance(v, float) and math.isfinite(v) for v in losses.values()), runs["fit"]
    assert isinstance(runs["validate"]["eval_loss"], float) and math.isfinite(runs["validate"]["eval_loss"])


def test_convert_of_a_checkpoint_with_full_weights_says_so_not_deepspeed(tmp_path, capsys):
    """Issue 31: ``taskfit convert`` on a DDP (or single-device) checkpoint, which already holds
    ``model.safetensors``, says there is nothing to convert, without speaking of DeepSpeed."""
    import sys as _sys

    from taskfit import Fit
    from taskfit.cli.checkpoints import convert_main

    _sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from jobs_common import SumRegression, sum_data

    fit = Fit(output_dir=str(tmp_path / "out"), disable_tqdm=True, report_to="none", save_strategy="steps",
              save_steps=2, max_steps=2, per_device_train_batch_size=4)
    fit.fit(SumRegression(), sum_data(8))
    assert convert_main([str(tmp_path / "out" / "checkpoint-2"), str(tmp_path / "full")]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "nothing to convert" in err and "DeepSpeed" not in err
