"""Issue 31, what reaches the loggers: a Lightning-style ``val_*`` name is grouped under ``val/`` in TensorBoard (not
``train/val_loss``); the module's ``save_hyperparameters`` values reach every logger beside the run's arguments."""

from __future__ import annotations

import os

import yaml
from logger_test_model import Regression, regression_data
from taskfit import Fit
from taskfit.loggers.tensorboard import tensorboard_tag


def test_tensorboard_groups_lightning_stage_names():
    assert tensorboard_tag("val_loss") == "val/loss" and tensorboard_tag("val_acc") == "val/acc"
    assert tensorboard_tag("validation_loss") == "validation/loss"
    assert tensorboard_tag("eval_loss") == "eval/loss" and tensorboard_tag("loss") == "train/loss"
    assert tensorboard_tag("train_loss") == "train/train_loss"  # unchanged: a user's own train_loss


class WithHparams(Regression):
    val_metric = "val_loss"

    def __init__(self, hidden: int = 7, dropout: float = 0.25, note: str = "x") -> None:
        super().__init__()
        self.save_hyperparameters()


def test_val_names_and_save_hyperparameters_reach_the_loggers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fit = Fit(output_dir=str(tmp_path), disable_tqdm=True, report_to=["csv", "tensorboard"], save_strategy="no",
              max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=2, per_device_train_batch_size=2,
              learning_rate=0.05)
    fit.fit(WithHparams(hidden=9), regression_data(8), regression_data(4, 1))
    acc = EventAccumulator(os.path.join(tmp_path, "logs"))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert "val/loss" in scalars and "train/val_loss" not in scalars
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 4]
    text = acc.Tensors("hparams/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "hidden: 9" in text and "dropout: 0.25" in text and "learning_rate: 0.05" in text
    hparams = yaml.safe_load((tmp_path / "logs" / "hparams.yaml").read_text())
    assert hparams["hidden"] == 9 and hparams["note"] == "x" and hparams["learning_rate"] == 0.05
