"""The overhead suite's Engine row (F-ENGINE-1, F-BENCH-1): the hand-written loop on ``Engine`` ends with exactly
the plain loop's weights on every workload, so its per-step overhead is measured on the same work. Speed is
measured by ``python -m benchmarks overhead``, never asserted here."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a top-level folder of the checkout

from benchmarks import overhead  # noqa: E402


def test_F_ENGINE_1_overhead_suite_has_an_engine_row_with_the_plain_loops_weights(tmp_path):
    status = overhead.run_suite(quick=True, out_dir=str(tmp_path), reps=1, runners=["raw", "engine"],
                                workloads=["tiny_mlp", "mlp"], steps={"tiny_mlp": 20, "mlp": 8}, in_process=True)
    data = json.loads((tmp_path / "results.json").read_text())
    assert status == 0 and data["runners"] == ["raw", "engine"]
    for name, per in data["workloads"].items():
        assert per["engine"]["weight_max_abs_diff"] == 0.0, name
        assert per["engine"]["step_s"]["median"] > 0 and "median" in per["engine"]["overhead_us"], name
    assert "taskfit Engine" in (tmp_path / "results.md").read_text()
