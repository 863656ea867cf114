"""Hugging Face's own example scripts as the judge of ``taskfit.hf`` (``make peer-hf PEER_HF_EXAMPLES=folder``).

The folder holds transformers' ``examples/pytorch/text-classification/run_classification.py`` and
``examples/pytorch/language-modeling/run_clm.py`` (from the public ``huggingface/transformers`` repository, kept
outside this repository: their code is not ours). For each script the runner builds offline inputs in a temporary
folder (``hf_example_inputs.py``: a tiny model from a config, a tokenizer trained here on text shipped in a package,
data files of that text), runs the script unchanged under transformers and once with its Trainer imports moved to
``taskfit.hf`` (the rewrite of ``run_hf_suite.py``), with the same command line, and compares: the exit status, every
number in the ``*_results.json`` files and ``trainer_state.json`` (timings excepted), the weights, and the set of
files each side wrote. It exits 1 when a difference is found that ``hf_examples_exceptions.txt`` does not list
(same format and kinds as ``hf_exceptions.txt``), 2 on a usage error.

Usage::

    python tests/peers/run_hf_examples.py FOLDER [--scripts run_clm.py ...] [--out DIR] [--rtol 0] [--verbose]

``FOLDER`` holds ``examples/pytorch/...`` (or the two scripts directly).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hf_example_inputs as inputs
from example_compare import compare_outputs
from peer_common import read_exceptions
from run_hf_suite import PEER, rewrite_imports, taskfit_hf_names

HERE = Path(__file__).resolve().parent
DEFAULT_EXCEPTIONS = HERE / "hf_examples_exceptions.txt"
#: the command line both sides get (after the script's own data and model options); the learning rate is high
#: enough that 10 steps move a tiny random model's loss (at the default 5e-5 it stays at its initial value, and
#: equal numbers would prove little)
COMMON_ARGS = ["--do_train", "--do_eval", "--max_steps", "10", "--seed", "42", "--use_cpu", "--report_to", "none",
               "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--logging_steps", "2",
               "--learning_rate", "2e-3", "--dataloader_num_workers", "0"]


@dataclass(frozen=True)
class Example:
    """One example script: where it lies under the folder, how its inputs are built and its own options."""

    rel_path: str
    build: Callable[[Path], dict[str, Path]]
    args: Callable[[dict[str, Path]], list[str]]


EXAMPLES = {
    "run_classification.py": Example(
        "examples/pytorch/text-classification/run_classification.py", inputs.build_classification,
        lambda p: ["--model_name_or_path", str(p["model"]), "--train_file", str(p["train"]), "--validation_file",
                   str(p["validation"]), "--test_file", str(p["test"]), "--do_predict", "--max_seq_length", "64"]),
    "run_clm.py": Example(
        "examples/pytorch/language-modeling/run_clm.py", inputs.build_clm,
        lambda p: ["--model_name_or_path", str(p["model"]), "--train_file", str(p["train"]), "--validation_file",
                   str(p["validation"]), "--block_size", "32"]),
}


def find_script(folder: Path, name: str) -> Path:
    """The script ``name`` under ``folder`` (at its path in the transformers repository, or directly inside).

    Raises:
        FileNotFoundError: neither exists (both paths named).
    """
    cands = [folder / EXAMPLES[name].rel_path, folder / name]
    for cand in cands:
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"{name}: none of {', '.join(map(str, cands))} exists")


def side_env(home: Path) -> dict[str, str]:
    """The environment of one run: offline, CPU only, one thread, its own HF cache folder ``home``."""
    env = {**os.environ, **PEER.env, "HF_HOME": str(home), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("PYTHONPATH", None)
    return env


def prepare_side(work: Path, side: str, script: Path, names: set[str]) -> Path:
    """``work/side`` with the script (its Trainer imports moved to ``taskfit.hf`` when ``side == "taskfit"``) and
    the metric stand-in; returns the script's copy."""
    folder = work / side
    inputs.write_metric(folder)
    dest = folder / script.name
    text = script.read_text(encoding="utf-8")
    if side == "taskfit":
        text, moved = rewrite_imports(text, names)
        if not moved:
            raise ValueError(f"{script}: no import of a taskfit.hf name to move")
    dest.write_text(text, encoding="utf-8")
    return dest


def run_script(script: Path, args: list[str], out_dir: Path, timeout: int) -> int:
    """Run ``script`` in its folder with ``args`` and ``--output_dir out_dir``; its output goes to
    ``out_dir.with_suffix(".log")``. Returns the exit status (124 on timeout)."""
    log = out_dir.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as f:
        try:
            return subprocess.run([sys.executable, script.name, *args, "--output_dir", str(out_dir)], cwd=script.parent,
                                  env=side_env(script.parent / "hf_home"), stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            return 124


def run_example(name: str, script: Path, work: Path, names: set[str], timeout: int) -> dict[str, tuple[int, Path]]:
    """Build the inputs once, run both sides one after the other (each gets both cores' worth of time).

    Returns:
        dict[str, tuple[int, Path]]: ``{side: (exit status, output_dir)}`` for ``"hf"`` and ``"taskfit"``.
    """
    ex = EXAMPLES[name]
    paths = ex.build(work / "inputs")
    out = {}
    for side in ("hf", "taskfit"):
        copy = prepare_side(work, side, script, names)
        out_dir = work / side / "output"
        out[side] = (run_script(copy, [*ex.args(paths), *COMMON_ARGS], out_dir, timeout), out_dir)
    return out


def report_example(name: str, results: dict[str, tuple[int, Path]], listed: dict[str, tuple[str, str]],
                   rtol: float, verbose: bool = False) -> int:
    """Print the checks of one script (``  DIFF  id  -- detail``; with ``verbose`` also ``  same  id``) and its
    summary line.

    Returns:
        int: the unlisted differences.
    """
    (rc_hf, out_hf), (rc_tf, out_tf) = results["hf"], results["taskfit"]
    checks = [("exit status", rc_hf == rc_tf, f"HF {rc_hf}, taskfit {rc_tf}")]
    checks += compare_outputs(out_hf, out_tf, rtol)
    unlisted = listed_n = 0
    print(f"== {name}")
    for check, same, detail in checks:
        key = f"{name}::{check}"
        note = ""
        if not same:
            if key in listed:
                kind, why = listed[key]
                listed_n += 1
                note = f"  -- {detail}; listed ({kind}: {PEER.kinds[kind]}): {why}"
            else:
                unlisted += 1
                note = f"  -- UNLISTED: {detail}"
        if verbose or not same:
            print(f"  {'same' if same else 'DIFF'}  {key}{note}")
    print(f"summary {name}: checks {len(checks)}, same {len(checks) - unlisted - listed_n}, listed {listed_n}, "
          f"unlisted differences {unlisted} (HF exit {rc_hf}, taskfit exit {rc_tf})")
    return unlisted


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a folder holding examples/pytorch/... of transformers")
    p.add_argument("--scripts", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    p.add_argument("--exceptions", type=Path, default=DEFAULT_EXCEPTIONS)
    p.add_argument("--out", type=Path, default=None, help="keep the runs' folders here (default: temporary, removed)")
    p.add_argument("--rtol", type=float, default=0.0,
                   help="relative tolerance of the numbers compared (default 0: bitwise, same init and data order; "
                        "evaluation means get 1e-6, see example_compare.EVAL_MEAN_RTOL)")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per script run")
    p.add_argument("--verbose", action="store_true", help="also print every check that found no difference")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run each script under transformers and under taskfit and report; see the module doc."""
    a = _parse(argv)
    if not a.folder.is_dir():
        print(f"run_hf_examples: {a.folder} is not a folder", file=sys.stderr)
        return 2
    try:
        scripts = {n: find_script(a.folder, n) for n in a.scripts}
    except FileNotFoundError as e:
        print(f"run_hf_examples: {e}", file=sys.stderr)
        return 2
    listed = read_exceptions(a.exceptions, PEER.kinds)
    names = set(taskfit_hf_names())
    work = a.out or Path(tempfile.mkdtemp(prefix="peer-hf-examples-"))
    unlisted = 0
    for name, script in scripts.items():
        results = run_example(name, script, work / Path(name).stem, names, a.timeout)
        unlisted += report_example(name, results, listed, a.rtol, a.verbose)
    print(f"summary examples: scripts {len(scripts)}, unlisted differences {unlisted}")
    if a.out is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"(inputs, outputs and logs in {work})")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
