"""Smoke tests of the benchmark harness (F-BENCH-1, F-BENCH-4). Benchmarks measure, they do not pass or fail:
these tests check only correctness (result structure, raw-vs-taskfit weights bitwise equal, CLI errors),
never speed."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(
        0, str(ROOT)
    )  # benchmarks/ is a top-level folder of the checkout, not part of the package

from benchmarks import (
    SUITES,
    overhead,
)
from benchmarks.__main__ import main as bench_main

SMOKE_STEPS = {"tiny_mlp": 30, "mlp": 12, "transformer": 12}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One in-process overhead run (raw and taskfit, one repetition, few steps) and its result JSON."""
    out = tmp_path_factory.mktemp("overhead")
    status = overhead.run_suite(
        quick=True,
        check=True,
        out_dir=str(out),
        reps=1,
        runners=["raw", "taskfit"],
        steps=SMOKE_STEPS,
        in_process=True,
    )
    return status, json.loads((out / "results.json").read_text()), out


def test_overhead_smoke_result_structure(smoke):
    """F-BENCH-1 / F-BENCH-4: the overhead suite writes JSON + Markdown with machine labels, per-workload
    ratios and absolute overheads for taskfit against the hand-written loop, and import times."""
    _, data, out = smoke
    assert (out / "results.md").is_file()
    assert data["suite"] == "overhead"
    assert {"torch", "taskfit"} <= set(data["machine"]["versions"]) and data["machine"]["threads"] == 1
    assert data["machine"]["cpu"]
    assert data["runners"] == ["raw", "taskfit"]
    assert set(data["workloads"]) == set(SMOKE_STEPS)
    for name, per in data["workloads"].items():
        row = per["taskfit"]
        assert row["step_s"]["median"] > 0 and row["ratio"]["median"] > 0, name
        assert {"median", "min", "max", "n"} <= set(row["overhead_us"])
        assert row["per_rep"][0]["measured_steps"] == SMOKE_STEPS[name] - overhead.QUICK_WARMUP - 1
    assert data["imports"]["taskfit"]["import_total_s"]["median"] > 0
    assert "hand-written loop" in (out / "results.md").read_text()


def test_overhead_taskfit_weights_equal_hand_written_loop(smoke):
    """F-BENCH-1: same init seed, same batches, same optimizer: taskfit ends with exactly the hand-written
    loop's weights in 32-true on every workload, so the weight-difference check passes."""
    _, data, _ = smoke
    for name, per in data["workloads"].items():
        assert per["taskfit"]["weight_max_abs_diff"] == 0.0, name
    assert not [f for f in data["check"]["failures"] if "weights" in f]


def test_check_flags_large_ratio_and_weight_difference(smoke):
    """``--check`` fails on a ratio above 1.05 on a larger workload and on any weight difference; the tiny
    workload's ratio alone never fails it."""
    _, data, _ = smoke
    fake = json.loads(json.dumps(data))
    fake["workloads"]["tiny_mlp"]["taskfit"]["ratio"]["median"] = 3.0
    fake["workloads"]["mlp"]["taskfit"]["ratio"]["median"] = 1.0
    fake["workloads"]["transformer"]["taskfit"]["ratio"]["median"] = 1.0
    assert overhead._check_failures(fake, list(SMOKE_STEPS)) == []
    fake["workloads"]["mlp"]["taskfit"]["ratio"]["median"] = 1.2
    fake["workloads"]["mlp"]["taskfit"]["best_ratio"] = 1.01  # issue 31: the gate reads the median the table prints
    fake["workloads"]["transformer"]["taskfit"]["weight_max_abs_diff"] = 1e-7
    failures = overhead._check_failures(fake, list(SMOKE_STEPS))
    assert len(failures) == 2 and "mlp" in failures[0] and "transformer" in failures[1]


def test_unknown_suite_lists_valid_ones(capsys):
    """F-BENCH-4: an unknown suite name exits with status 2 naming the valid suites and the closest one."""
    with pytest.raises(SystemExit) as exc:
        bench_main(["overheat"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "overheat" in err and 'Did you mean "overhead"' in err
    for name in SUITES:
        assert name in err


def test_unknown_runner_and_check_on_other_suite(capsys):
    with pytest.raises(SystemExit):
        bench_main(["overhead", "--only", "keras"])
    assert "keras" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["techniques", "--check"])
    assert "overhead suite only" in capsys.readouterr().err


def test_taskfit_bench_delegates_to_benchmarks(capsys):
    """``taskfit bench`` is the same command line as ``python -m benchmarks`` (from a checkout)."""
    from taskfit.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "nosuch"])
    assert exc.value.code == 2
    assert "Valid suites" in capsys.readouterr().err


def test_suites_skip_unbuilt_rows_with_reason():
    """Rows whose feature is not built (or needs absent hardware) are skipped with a reason, decided at run
    time from the registries and FitArguments' pending gate."""
    from benchmarks import checkpoint, strategies, techniques

    assert (
        techniques.precheck(next(r for r in techniques.ROWS if r[0] == "tf32"), "cpu")
        == "needs a CUDA device"
    )
    assert techniques.precheck(techniques.ROWS[0], "cpu") is None
    assert strategies.precheck(strategies.ROWS[0]) is None
    for row in strategies.ROWS[1:]:
        reason = strategies.precheck(row)
        assert reason is None or isinstance(reason, str) and reason
    assert checkpoint.precheck(checkpoint.ROWS[0]) is None
