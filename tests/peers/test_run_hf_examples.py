"""The HF example-script runner itself (tests/peers/run_hf_examples.py, example_compare.py): its import rewrite of
a script, its comparison of two output folders and its verdict, on synthetic files (no transformers example script,
no network, no training)."""

import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the runner imports its sibling modules by name, as when run as a script
_spec = importlib.util.spec_from_file_location("run_hf_examples", HERE / "run_hf_examples.py")
run_hf_examples = importlib.util.module_from_spec(_spec)
sys.modules["run_hf_examples"] = run_hf_examples
_spec.loader.exec_module(run_hf_examples)

import example_compare  # after the path set-up above

SCRIPT = '''\
import evaluate
from transformers import (
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.utils import check_min_version
'''


def test_prepare_side_moves_only_the_trainer_names_and_writes_the_metric(tmp_path):
    """The taskfit copy gets the suite runner's rewrite (HfArgumentParser stays with transformers: not a taskfit.hf
    name), the HF copy is byte-identical, and both folders hold the local accuracy metric."""
    script = tmp_path / "src" / "run_x.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    names = {"Trainer", "TrainingArguments", "set_seed", "EvalPrediction"}
    hf = run_hf_examples.prepare_side(tmp_path / "work", "hf", script, names)
    tf = run_hf_examples.prepare_side(tmp_path / "work", "taskfit", script, names)
    assert hf.read_text() == SCRIPT
    assert tf.read_text() == ("import evaluate\nfrom taskfit.hf import Trainer, TrainingArguments, set_seed\n"
                              "from transformers import AutoTokenizer, HfArgumentParser\n"
                              "from transformers.utils import check_min_version\n")
    for side in ("hf", "taskfit"):
        metric = tmp_path / "work" / side / "accuracy" / "accuracy.py"
        assert "class Accuracy(evaluate.Metric)" in metric.read_text()
        compile(metric.read_text(), str(metric), "exec")


def test_compare_json_numbers_timings_and_missing_keys():
    hf = {"train_loss": 0.5, "train_runtime": 1.0, "epoch": 1.0, "only_hf": 1, "log_history": [{"loss": 0.7}]}
    tf = {"train_loss": 0.5000001, "train_runtime": 9.0, "epoch": 1.0, "log_history": [{"loss": 0.7}]}
    checks = {c[0]: c for c in example_compare.compare_json("all_results.json", hf, tf, rtol=0.0)}
    assert checks["all_results.json:train_loss"][1] is False
    assert "HF 0.5, taskfit 0.5000001" in checks["all_results.json:train_loss"][2]
    assert checks["all_results.json:train_runtime"][1:] == (True, "timing")
    assert checks["all_results.json:only_hf"][1:] == (False, "only under HF")
    assert checks["all_results.json:log_history[0].loss"][1] is True
    loose = {c[0]: c[1] for c in example_compare.compare_json("all_results.json", hf, tf, rtol=1e-5)}
    assert loose["all_results.json:train_loss"] is True
    # an evaluation mean may differ in its last digits (summation order), by no more than 1e-6 relative
    evals = {c[0]: c[1] for c in example_compare.compare_json(
        "eval_results.json", {"eval_loss": 5.743819236755371, "perplexity": 312.25, "eval_accuracy": 0.5},
        {"eval_loss": 5.743819713592529, "perplexity": 312.26, "eval_accuracy": 0.5}, rtol=0.0)}
    assert evals == {"eval_results.json:eval_loss": True, "eval_results.json:perplexity": False,
                     "eval_results.json:eval_accuracy": True}


def _folder(root: Path, weights: dict, state: dict, extra: str | None = None) -> Path:
    (root / "checkpoint-2").mkdir(parents=True)
    save_file(weights, str(root / "model.safetensors"))
    (root / "checkpoint-2" / "trainer_state.json").write_text(json.dumps(state))
    (root / "predict_results.txt").write_text("index\tprediction\n0\t1\n")
    if extra:
        (root / extra).write_text("x")
    return root


def test_compare_outputs_files_weights_and_states(tmp_path):
    w = {"a": torch.arange(4, dtype=torch.float32)}
    hf = _folder(tmp_path / "hf", w, {"global_step": 2, "eval_steps": 500}, extra="training_args.bin")
    tf = _folder(tmp_path / "tf", {"a": w["a"] + torch.tensor([0, 0, 0, 1e-3])}, {"global_step": 2, "eval_steps": 2},
                 extra="fit_args.json")
    checks = {c[0]: c for c in example_compare.compare_outputs(hf, tf, rtol=0.0)}
    assert checks["file training_args.bin"][1:] == (False, "written under HF only")
    assert checks["file fit_args.json"][1:] == (False, "written under taskfit only")
    assert checks["checkpoint-2/trainer_state.json:global_step"][1] is True
    assert checks["checkpoint-2/trainer_state.json:eval_steps"][1] is False
    assert checks["predict_results.txt"][1] is True
    same, detail = checks["model.safetensors"][1:]
    assert not same and detail.startswith("a: max |diff| / max |value| = ")
    assert {c[0]: c[1] for c in example_compare.compare_outputs(hf, tf, rtol=1e-3)}["model.safetensors"] is True


def test_report_counts_listed_and_unlisted(tmp_path, capsys):
    """A difference listed in the exceptions file (kind 2) does not fail the verdict; an unlisted one does, and the
    exit statuses are compared first."""
    w = {"a": torch.zeros(2)}
    hf = _folder(tmp_path / "hf", w, {"eval_steps": 500}, extra="training_args.bin")
    tf = _folder(tmp_path / "tf", w, {"eval_steps": 2})
    results = {"hf": (0, hf), "taskfit": (0, tf)}
    listed = {"run_x.py::file training_args.bin": ("2", "docs/hf.md row: checkpoint folder")}
    assert run_hf_examples.report_example("run_x.py", results, listed, 0.0, verbose=True) == 1
    text = capsys.readouterr().out
    assert "  same  run_x.py::exit status" in text
    assert ("  DIFF  run_x.py::file training_args.bin  -- written under HF only; listed (2: documented difference): "
            "docs/hf.md row: checkpoint folder") in text
    assert "  DIFF  run_x.py::checkpoint-2/trainer_state.json:eval_steps  -- UNLISTED: HF 500, taskfit 2" in text
    assert "summary run_x.py: checks 5, same 3, listed 1, unlisted differences 1 (HF exit 0, taskfit exit 0)" in text
    results["taskfit"] = (1, tf)
    assert run_hf_examples.report_example("run_x.py", results, {}, 0.0) == 3
    text = capsys.readouterr().out
    assert "  DIFF  run_x.py::exit status  -- UNLISTED: HF 0, taskfit 1" in text and "  same  " not in text


def test_usage_errors_exit_2(tmp_path, capsys):
    assert run_hf_examples.main([str(tmp_path / "missing")]) == 2
    assert run_hf_examples.main([str(tmp_path)]) == 2
    assert "run_classification.py: none of" in capsys.readouterr().err


def test_the_repositorys_exceptions_list_reads():
    from peer_common import read_exceptions

    listed = read_exceptions(run_hf_examples.DEFAULT_EXCEPTIONS, run_hf_examples.PEER.kinds)
    assert all(key.split("::")[0] in run_hf_examples.EXAMPLES and kind in ("1", "2")
               for key, (kind, _) in listed.items())


def test_inputs_read_real_shipped_text():
    """The data builders read the packages' own files: tweets of both authors in turn, the KJV from Genesis 1:1."""
    import hf_example_inputs

    rows = hf_example_inputs.election_tweets(4)
    assert [label for _, label in rows] == [0, 1, 0, 1] and all(len(text) > 20 for text, _ in rows)
    assert hf_example_inputs.kjv_verses(1)[0].startswith("In the beginning God created the heaven and the earth")
