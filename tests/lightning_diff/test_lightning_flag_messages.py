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


def test_F_LIT_DOOR_fast_dev_run_overrides_the_validation_schedule(tmp_path):
    """``fast_dev_run`` validates after its one short epoch whatever ``val_check_interval`` says (an int above the
    epoch's batches is not refused), and the float-with-``check_val_every_n_epoch=None`` error has Lightning's
    message."""
    import warnings

    import torch

    import lightning
    import taskfit.lightning
    from harness import data, linear

    got, errors = {}, {}
    for name, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        calls = []

        class M(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx):
                calls.append(batch_idx)

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), fast_dev_run=1, val_check_interval=2,
                            enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8), data(n=8))
        got[name] = (calls, trainer.global_step)
        with pytest.raises(Exception) as err:
            L.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
        errors[name] = str(err.value)
    assert got["taskfit"] == got["lightning"]
    assert errors["taskfit"] == errors["lightning"]
