"""The progress bar's Lightning checks and values, the same script under ``lightning`` and ``taskfit.lightning``
(F-LIT-6): two bars, or a bar with ``enable_progress_bar=False``, are refused with Lightning's messages;
``TQDMProgressBar``'s refresh rate follows ``TQDM_MINITERS`` and Colab as Lightning's; ``get_metrics`` shows the
loggers' version as ``v_num``, none for ``fast_dev_run``'s dummy logger."""

from __future__ import annotations

import os
import warnings
from unittest import mock

import pytest
from harness import data, linear
from two_doors import callbacks_of, frameworks


def test_F_LIT_6_progress_bar_misconfiguration_messages():
    messages = {}
    for name, L in frameworks().items():
        cb = callbacks_of(L)
        with pytest.raises(Exception) as two:
            L.Trainer(callbacks=[cb.TQDMProgressBar(), cb.TQDMProgressBar()], logger=False)
        with pytest.raises(Exception) as off:
            L.Trainer(callbacks=cb.TQDMProgressBar(), enable_progress_bar=False, logger=False)
        messages[name] = [str(two.value), str(off.value)]
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        assert isinstance(two.value, MisconfigurationException) and isinstance(off.value, MisconfigurationException)
    assert messages["taskfit"] == messages["lightning"]
    assert messages["taskfit"][1] == ("Trainer was configured with `enable_progress_bar=False` but found "
                                      "`TQDMProgressBar` in callbacks list.")


@pytest.mark.parametrize(("env", "given"), [({"TQDM_MINITERS": "1"}, 0), ({"TQDM_MINITERS": "0"}, 1),
                                            ({"TQDM_MINITERS": "2"}, 1), ({"TQDM_MINITERS": "1"}, 2),
                                            ({"COLAB_GPU": "1"}, 1), ({"COLAB_GPU": "1"}, 19), ({}, 1)])
def test_F_LIT_6_tqdm_refresh_rate_from_the_environment(env, given):
    rates = {}
    for name, L in frameworks().items():
        with mock.patch.dict(os.environ, env):
            rates[name] = callbacks_of(L).TQDMProgressBar(refresh_rate=given).refresh_rate
    assert rates["taskfit"] == rates["lightning"]


def test_F_LIT_6_progress_bar_version_number(tmp_path):
    """``v_num``: absent with fast_dev_run's dummy logger and without loggers, the version with one logger, the
    distinct versions joined by ``_`` with several (a string shown by its last 4 characters)."""
    seen = {}
    for name, L in frameworks().items():
        import importlib

        lg = importlib.import_module("lightning.pytorch.loggers" if name == "lightning" else "taskfit.lightning.loggers")
        runs = [{"fast_dev_run": True}, {"logger": False}, {"logger": lg.CSVLogger(tmp_path / name, version=7)},
                {"logger": [lg.CSVLogger(tmp_path / name, version=7), lg.CSVLogger(tmp_path / name, version="abcdef")]}]
        out = []
        for kw in runs:
            trainer = L.Trainer(default_root_dir=tmp_path / name, max_steps=1, enable_model_summary=False,
                                enable_checkpointing=False, **kw)
            model = linear(L.LightningModule)()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(model, data(8))
            out.append(trainer.progress_bar_callback.get_metrics(trainer, model).get("v_num"))
        seen[name] = out
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"] == [None, None, 7, "cdef"]  # "7_abcdef", its last 4 characters
