"""Issue 31: a benchmark report states its own uncertainty. A ratio is printed only when the repetitions' spread is
smaller than its distance from 1.0 (else "not enough repetitions to compare"); the ``--check`` gate decides on the
same statistic the table prints (the median of per-repetition ratios); chart labels are plain numbers."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import compare_ratio, plain_number, summary
from benchmarks.overhead import CHECK_RATIO, _check_failures


def test_a_ratio_whose_spread_exceeds_its_difference_is_not_compared():
    # strategies --quick: 0.46 .. 1.85 around 1.0 -> no ratio
    assert compare_ratio(summary([0.46, 1.02, 1.85])).startswith("not enough repetitions to compare")
    assert compare_ratio(summary([1.21])) == "not enough repetitions to compare (1 repetition)"
    assert compare_ratio(summary([1.19, 1.21, 1.38])) == "1.21x (1.19-1.38, 3 reps)"
    assert compare_ratio(summary([0.97, 1.02, 1.10])).startswith("not enough repetitions to compare")
    assert compare_ratio(None) == "-"


def _row(ratios, best):
    return {"ratio": summary(ratios), "best_ratio": best, "weight_max_abs_diff": 0.0}


def test_the_gate_uses_the_median_the_table_prints():
    slow = {"workloads": {"mlp": {"taskfit": _row([1.21, 1.38, 1.20], best=1.01)}}}
    failures = _check_failures(slow, ["mlp"])
    assert len(failures) == 1 and "1.210" in failures[0] and str(CHECK_RATIO) in failures[0]
    noisy = {"workloads": {"mlp": {"taskfit": _row([0.454, 1.055, 1.132], best=0.9)}}}
    failures = _check_failures(noisy, ["mlp"])  # the table says "not enough repetitions to compare": so does the gate
    assert len(failures) == 1 and "not enough repetitions to compare" in failures[0]
    fine = {"workloads": {"mlp": {"taskfit": _row([1.01, 1.03, 1.02], best=1.0)}}}
    assert _check_failures(fine, ["mlp"]) == []


def test_chart_labels_are_plain_numbers():
    assert plain_number(1170.4) == "1170" and plain_number(3860.0) == "3860"
    assert plain_number(1.2137) == "1.21" and plain_number(0.0042) == "0.0042" and plain_number(-38.6) == "-38.6"
    assert "e" not in plain_number(1.5e6) and "e" not in plain_number(2e-5)


def test_quick_techniques_run_does_not_claim_per_row_memory():
    """One process for all rows (``--quick``, CPU): the peak-RSS increase of a later row is what that row added
    to memory the earlier rows already took (8-bit AdamW read 0.004x, 952 KiB), so no memory ratio is given
    and the cell says why; a process per row gives the ratio."""
    from benchmarks.techniques import relative_to_baseline

    def rows():
        return {"baseline": {"samples_per_s": 10.0, "peak_bytes": 250e6},
                "adamw_8bit": {"samples_per_s": 9.0, "peak_bytes": 952 * 1024}}

    one = relative_to_baseline(rows(), per_row_memory=False)
    assert one["adamw_8bit"]["speed_vs_baseline"] == 0.9
    assert one["adamw_8bit"]["memory_vs_baseline"] is None and one["adamw_8bit"]["memory_note"]
    each = relative_to_baseline(rows(), per_row_memory=True)
    assert abs(each["adamw_8bit"]["memory_vs_baseline"] - 952 * 1024 / 250e6) < 1e-12
