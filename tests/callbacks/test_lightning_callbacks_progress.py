"""F-OBS-1 / F-LIT-6: the tqdm bar and RichProgressBar show the epoch, the step, the loss and every value logged
with ``prog_bar=True``, evaluation values included (Lightning's ``get_metrics``); read from the rendered text."""

from __future__ import annotations

import io
import re

import pytest
import torch
from helpers.models import LightningStyle
from taskfit import Fit
from taskfit.callbacks import ProgressBar, RichProgressBar
from torch.utils.data import TensorDataset


class Shown(LightningStyle):
    """The canonical Lightning-style module (3 features, seed 0, SGD lr 0.1) logging fixed values: ``shown`` and
    ``val_score`` for the bar, ``hidden`` not."""

    def training_step(self, batch, batch_idx):
        self.log("shown", 0.25, prog_bar=True)
        self.log("hidden", 0.5)
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_score", 0.75, prog_bar=True)


def _data() -> TensorDataset:
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(-1, keepdim=True))


def _fit(tmp_path, bar) -> Fit:
    return Fit(output_dir=str(tmp_path), report_to="none", save_strategy="no", eval_strategy="epoch",
               num_train_epochs=2, per_device_train_batch_size=8, per_device_eval_batch_size=8, logging_steps=1,
               callbacks=[bar])


def _check(metrics: dict) -> None:
    assert metrics["step"] == 4 and metrics["shown"] == "0.25" and metrics["val_score"] == "0.75"
    assert "loss" in metrics and "learning_rate" in metrics and "hidden" not in metrics


def test_tqdm_bar_shows_epoch_step_loss_and_prog_bar_values_F_OBS_1(tmp_path, capsys):
    bar = ProgressBar()
    fit = _fit(tmp_path, bar)
    assert [cb for cb in fit.callbacks if isinstance(cb, ProgressBar)] == [bar]  # it replaces the default
    fit.fit(Shown(), _data(), _data())
    _check(bar.metrics)
    last = capsys.readouterr().err.split("\r")[-1]  # the bar's final line
    assert re.search(r"Epoch 1: 100%.*4/4", last), last
    for text in ("step=4", "loss=", "shown=0.25", "val_score=0.75"):
        assert text in last, (text, last)
    assert "hidden" not in last


def test_rich_bar_shows_the_same_values_F_OBS_1(tmp_path):
    pytest.importorskip("rich")
    out = io.StringIO()
    bar = RichProgressBar(leave=True, console_kwargs={"file": out, "width": 240, "force_terminal": True,
                                                      "color_system": None})
    fit = _fit(tmp_path, bar)
    fit.fit(Shown(), _data(), _data())
    _check(bar.metrics)
    text = out.getvalue()
    final = [line for line in text.splitlines() if "Epoch 1" in line][-1]
    assert "4/4" in final
    for piece in ("step: 4", "loss: ", "shown: 0.25", "val_score: 0.75"):
        assert piece in final, (piece, final)
    assert "hidden" not in text
    with pytest.raises(ValueError, match="refresh_rate=0"):
        RichProgressBar(refresh_rate=0)
