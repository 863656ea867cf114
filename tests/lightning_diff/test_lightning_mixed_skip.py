"""``training_step`` returning None under ``"16-mixed"`` (fp16 autocast and a ``GradScaler``, on CPU here): the
skipped batch leaves the scaler alone (no ``unscale_``, ``step`` or ``update``), as Lightning's ``MixedPrecision``;
weights and the scaler's ``state_dict`` equal ``lightning.Trainer``'s for the same module."""

import warnings

import pytest
import torch

from harness import data, linear
from two_doors import frameworks


def _scaler():
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 4, growth_interval=2)


@pytest.mark.parametrize("skipped", [(1,), (0, 1, 2, 3)])
def test_F_LIT_PREC_skipped_batch_leaves_the_scaler_alone_like_lightning(tmp_path, skipped):
    """Four batches, ``growth_interval=2``: the trained batches grow the scale as Lightning's, the skipped ones do
    not count (all skipped: the scaler is as built, and no step is taken)."""
    from lightning.pytorch.plugins import MixedPrecision as LightningMixed

    from taskfit.precision.precision import MixedPrecision

    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                return None if batch_idx in skipped else loss

        plugin = LightningMixed("16-mixed", "cpu", _scaler()) if name == "lightning" else \
            MixedPrecision("16-mixed", _scaler())
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=1, accelerator="cpu", devices=1,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, plugins=[plugin])
        torch.manual_seed(0)
        module = M()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data())
        got[name] = ({k: v.clone() for k, v in module.state_dict().items()}, plugin.scaler.state_dict())
    (w_l, s_l), (w_t, s_t) = got["lightning"], got["taskfit"]
    assert s_t == s_l
    assert w_t.keys() == w_l.keys() and all(torch.equal(w_t[k], w_l[k]) for k in w_l)
    assert s_l["scale"] == (2.0 ** 4 if len(skipped) == 4 else 2.0 ** 5)
