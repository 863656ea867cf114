"""The info line a Lightning ``Trainer`` logs when a batch limit is exactly ``1`` (one batch) or ``1.0`` (all
batches), equal under ``lightning.Trainer`` and ``taskfit.lightning.Trainer`` (F-LIT-DOOR-FLAGS)."""

import logging

import pytest


@pytest.mark.parametrize("name", ["limit_train_batches", "limit_val_batches", "limit_test_batches",
                                  "limit_predict_batches", "overfit_batches", "val_check_interval"])
@pytest.mark.parametrize("value", [1, 1.0, 2])
def test_F_LIT_DOOR_batch_limit_info_message_matches_lightning(name, value, caplog, tmp_path):
    import lightning
    import taskfit.lightning

    lines = {}
    for key, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            L.Trainer(default_root_dir=str(tmp_path), logger=False, **{name: value})
        lines[key] = [r.getMessage() for r in caplog.records if "was configured so" in r.getMessage()]
    assert lines["taskfit"] == lines["lightning"]
    assert len(lines["taskfit"]) == (value == 1)
