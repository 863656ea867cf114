"""Hooks wrapped on the instance (``unittest.mock.patch.object(model, name, wraps=...)``): Lightning's
``is_overridden`` reads them as what they wrap, so a recorder around the default ``validation_step`` is no
validation step (no validation, Lightning's warning), while every wrapped hook is still called as often as under
``lightning.Trainer``."""

import warnings
from unittest.mock import patch

import pytest
import torch

from harness import data, linear
from two_doors import frameworks, with_evaluation


@pytest.mark.parametrize("make", [linear, with_evaluation(linear)], ids=["default_validation_step", "own"])
def test_F_LIT_HOOK_wrapped_hooks_count_as_what_they_wrap_like_lightning(tmp_path, make):
    got = {}
    for name, L in frameworks().items():
        torch.manual_seed(0)
        module = make(L.LightningModule)()
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=1, accelerator="cpu", devices=1,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        with patch.object(module, "validation_step", wraps=module.validation_step) as val, \
                patch.object(module, "training_step", wraps=module.training_step) as train, \
                patch.object(module, "on_train_batch_end", wraps=module.on_train_batch_end) as batch_end, \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(module, data(), data(8))
        skipped = [w for w in caught if "have no `validation_step`" in str(w.message)]
        got[name] = (val.call_count, train.call_count, batch_end.call_count, len(skipped),
                     {k: v.clone() for k, v in module.state_dict().items()})
    *counts_l, w_l = got["lightning"]
    *counts_t, w_t = got["taskfit"]
    assert counts_t == counts_l
    assert counts_l == ([0, 4, 4, 1] if make is linear else [2, 4, 4, 0])
    assert all(torch.equal(w_t[k], w_l[k]) for k in w_l)
