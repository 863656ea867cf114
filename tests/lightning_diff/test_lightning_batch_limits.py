"""Batch-limit flags checked as Lightning's ``_determine_batch_limits``, the same constructor calls under
``lightning`` and ``taskfit.lightning`` (F-LIT-6): a value outside [0.0, 1.0] that is not a whole number raises
Lightning's configuration error naming the flag and the value; a whole float above 1 counts that many batches."""

from __future__ import annotations

import warnings

import pytest
from harness import data, linear
from two_doors import frameworks

BAD = [("limit_train_batches", -0.1), ("limit_val_batches", 1.2), ("limit_test_batches", -0.1),
       ("limit_predict_batches", 1.5), ("val_check_interval", 1.2), ("overfit_batches", -0.1)]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_F_LIT_6_invalid_batch_limits_refused_like_lightning(name, value):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    messages = {}
    for door, L in frameworks().items():
        with pytest.raises(MisconfigurationException) as err:
            L.Trainer(logger=False, **{name: value})
        messages[door] = str(err.value)
    assert messages["taskfit"] == messages["lightning"]
    assert messages["taskfit"] == f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] or an int."


def test_F_LIT_6_whole_float_limit_counts_batches(tmp_path):
    """``limit_train_batches=2.0`` trains 2 batches per epoch (an int), ``1e50`` every batch, as Lightning."""
    seen = {}
    for door, L in frameworks().items():
        steps = []
        for limit in (2.0, 1e50):
            trainer = L.Trainer(default_root_dir=tmp_path / door, max_epochs=1, limit_train_batches=limit, logger=False,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(linear(L.LightningModule)(), data(16))
            steps.append((trainer.global_step, trainer.num_training_batches))
        seen[door] = steps
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"] == [(2, 2), (4, 4)]


@pytest.mark.parametrize("flags", [{"fast_dev_run": -1}, {"reload_dataloaders_every_n_epochs": -1},
                                   {"reload_dataloaders_every_n_epochs": "test"}])
def test_F_LIT_6_negative_counts_refused_like_lightning(flags):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    messages = {}
    for door, L in frameworks().items():
        with pytest.raises(MisconfigurationException) as err:
            L.Trainer(logger=False, **flags)
        messages[door] = str(err.value)
    assert messages["taskfit"] == messages["lightning"]
