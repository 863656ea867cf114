"""What ``self.log`` accepts, judged by Lightning: ``reduce_fx`` in Lightning's spellings (any case of
mean/avg/sum/max/min, ``torch.max``, the builtins ``max``/``min``/``sum``) gives Lightning's epoch values in
``callback_metrics``; a value that is not a number, tensor or metric raises Lightning's ValueError
(F-LIT-DOOR-LOG)."""

import warnings

import pytest
import torch

from harness import data, linear


@pytest.mark.parametrize("fx", ["SUM", "avg", "Max", max, min, sum, torch.max, torch.mean])
def test_F_LIT_DOOR_reduce_fx_spellings_match_lightning(fx, tmp_path):
    import lightning
    import taskfit.lightning

    got = {}
    for name, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                self.log("bar", float(batch_idx), on_step=False, on_epoch=True, reduce_fx=fx)
                return super().training_step(batch, batch_idx)

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=16))
        got[name] = float(trainer.callback_metrics["bar"])
    assert got["taskfit"] == got["lightning"]


@pytest.mark.parametrize("value", [None, "foo", [1, 2], {"a": {"b": 1}}, {"a": None}])
def test_F_LIT_DOOR_log_refuses_what_lightning_refuses(value, tmp_path):
    """``self.log`` of something that is not a number, tensor or metric raises Lightning's ValueError, with its
    message, before the step goes on."""
    import lightning
    import taskfit.lightning

    errors = {}
    for name, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                self.log("foo", value)
                return super().training_step(batch, batch_idx)

        trainer = L.Trainer(default_root_dir=str(tmp_path / name), fast_dev_run=1, logger=False,
                            enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings(), pytest.raises(ValueError) as err:
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8))
        errors[name] = str(err.value)
    assert errors["taskfit"] == errors["lightning"]
