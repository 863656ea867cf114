"""The Lightning door's loop policy, each behaviour run under ``lightning.Trainer`` and ``taskfit.lightning.Trainer``
with only the import changed (F-LIT-DOOR): checkpoint callbacks run last (a resumed ``EarlyStopping`` continues
with Lightning's patience count), ``reload_dataloaders_every_n_epochs`` reloads the validation loaders too, and the
policy ``Fit`` and the door's ``Trainer`` hand to the loop."""

import warnings

import pytest
import torch
from harness import data, linear, same_weights
from torch.nn import functional as F
from two_doors import callbacks_of, frameworks


def _flat(validate):
    """A module whose monitored value never improves: ``flat`` is 1.0 every epoch, logged from ``validation_step``
    (``validate``) or per training step with ``on_epoch=True``; a ``ReduceLROnPlateau`` on it (patience 0, halving);
    ``epoch_ends`` records the epochs of its ``on_train_epoch_end``."""
    def make(base):
        class M(linear(base)):
            def __init__(self):
                super().__init__()
                self.epoch_ends = []

            def training_step(self, batch, batch_idx):
                if not validate:
                    self.log("flat", 1.0, on_step=False, on_epoch=True)
                return super().training_step(batch, batch_idx)

            def on_train_epoch_end(self):
                self.epoch_ends.append(self.current_epoch)

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "flat"}}

            if validate:
                def validation_step(self, batch, batch_idx):
                    self.log("flat", 1.0)
        return M
    return make


def _fit(L, make, folder, max_epochs, validate, ckpt_path=None):
    cbs = callbacks_of(L)
    es = cbs.EarlyStopping(monitor="flat", patience=10, check_on_train_epoch_end=not validate)
    # given before EarlyStopping: Lightning moves checkpoint callbacks last
    mc = cbs.ModelCheckpoint(dirpath=str(folder / "ck"), save_last=True)
    torch.manual_seed(0)
    module = make(L.LightningModule)()
    trainer = L.Trainer(default_root_dir=str(folder), enable_progress_bar=False, enable_model_summary=False,
                        logger=False, num_sanity_val_steps=0, max_epochs=max_epochs, callbacks=[mc, es])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, data(n=8), data(n=8) if validate else None, ckpt_path=ckpt_path)
    return module, trainer, es


@pytest.mark.parametrize("validate", [False, True], ids=["train_epoch_end", "validation"])
def test_F_LIT_DOOR_checkpoint_callbacks_run_last_so_early_stopping_resumes_its_count(tmp_path, validate):
    """F-LIT-DOOR: ``callbacks=[ModelCheckpoint, EarlyStopping]``: the trainer's callbacks are reordered with the
    checkpoint last, so the checkpoint of epoch 1 holds EarlyStopping's count after that epoch's check (1), and a
    run resumed from it to 3 epochs ends with ``wait_count`` 2, as Lightning (checked at the end of the training
    epoch and after validation); same steps and weights. A checkpoint taken after the epoch's validation resumes
    at the next epoch's start, as Lightning: epoch 1's ``on_train_epoch_end`` and plateau step are not run again
    (the learning rate after resuming is Lightning's)."""
    runs = {}
    for name, L in frameworks().items():
        _, first, _ = _fit(L, _flat(validate), tmp_path / name, 2, validate)
        module, trainer, es = _fit(L, _flat(validate), tmp_path / name, 3, validate, ckpt_path="last")
        order = [type(cb).__name__ for cb in first.callbacks if type(cb).__name__ in ("ModelCheckpoint",
                                                                                       "EarlyStopping")]
        runs[name] = (module, trainer, es, order)
    (ml, tl, el, ol), (mt, tt, et, ot) = runs["lightning"], runs["taskfit"]
    assert ot == ol == ["EarlyStopping", "ModelCheckpoint"]
    assert (et.wait_count, tt.global_step, tt.current_epoch) == (el.wait_count, tl.global_step,
                                                                   tl.current_epoch) == (2, 6, 3)
    assert float(et.best_score) == float(el.best_score) == 1.0
    assert mt.epoch_ends == ml.epoch_ends == [2]
    lr = [t.optimizers[0].param_groups[0]["lr"] for t in (tl, tt)]
    assert lr[0] == lr[1] == 0.05  # no plateau step for epoch 1 (taken after the checkpoint), one for epoch 2
    assert same_weights(ml, mt)


def _reloading(base):
    class M(linear(base)):
        def __init__(self):
            super().__init__()
            self.train_at, self.val_at, self.val_sizes = [], [], []

        def train_dataloader(self):
            self.train_at.append(self.trainer.current_epoch)
            return data(n=8, seed=len(self.train_at))

        def val_dataloader(self):
            self.val_at.append(self.trainer.current_epoch)
            return data(n=4 + 4 * len(self.val_at), seed=10 + len(self.val_at))

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.val_sizes.append((self.current_epoch, len(x)))
            self.log("val_loss", F.mse_loss(self.layer(x), y))
    return M


@pytest.mark.parametrize("sanity", [0, 2])
def test_F_LIT_DOOR_reload_dataloaders_every_n_epochs_reloads_validation_loaders(tmp_path, sanity):
    """F-LIT-DOOR: ``Trainer(reload_dataloaders_every_n_epochs=2)`` over 5 epochs calls the module's
    ``val_dataloader`` at epochs 0, 2, 4 (with and without the sanity check) and validates on the new loader (here
    longer each time), as Lightning: the same calls, validation batches, final ``val_loss`` and weights."""
    runs = {}
    for name, L in frameworks().items():
        torch.manual_seed(0)
        module = _reloading(L.LightningModule)()
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), enable_progress_bar=False, logger=False,
                            enable_model_summary=False, enable_checkpointing=False, max_epochs=5,
                            num_sanity_val_steps=sanity, reload_dataloaders_every_n_epochs=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module)
        runs[name] = (module, trainer)
    (ml, tl), (mt, tt) = runs["lightning"], runs["taskfit"]
    assert mt.train_at == ml.train_at == [0, 2, 4]
    assert mt.val_at == ml.val_at == [0, 2, 4]
    assert mt.val_sizes == ml.val_sizes
    assert float(tt.callback_metrics["val_loss"]) == pytest.approx(float(tl.callback_metrics["val_loss"]))
    assert same_weights(ml, mt)


def test_F_LIT_DOOR_loop_policy_chosen_once_by_fit_and_by_the_door(tmp_path):
    """F-LIT-DOOR: ``Fit`` hands HF's loop policy to the loop, the door's ``Trainer`` Lightning's, built from its
    flags (``min_epochs`` parsed as Lightning: 1 when only ``min_steps`` is given); the trainer attributes read
    it; a bad ``reload_dataloaders_every_n_epochs`` fails before any work, naming the value."""
    import taskfit.lightning as L
    from taskfit import Fit
    from taskfit.loops.policy import LoopPolicy

    hf = Fit(output_dir=str(tmp_path / "hf"), report_to="none").loop_policy
    assert hf == LoopPolicy() and (hf.counts_optimizer_steps, hf.eval_prefix, hf.min_epochs,
                                   hf.validation_closes_epoch) == (False, "eval", None, False)
    assert hf.clip_algorithm_argument(1.0, by_value=False) == "norm" and hf.clip_algorithm_argument(0.0, False) is None
    trainer = L.Trainer(default_root_dir=str(tmp_path / "l"), logger=False, min_steps=3,
                        reload_dataloaders_every_n_epochs=2, gradient_clip_val=0.5)
    policy = trainer.loop_policy
    assert (policy.counts_optimizer_steps, policy.min_epochs, policy.min_steps, policy.eval_prefix,
            policy.checkpoint_callbacks_last, policy.validation_closes_epoch) == (True, 1, 3, "", True, True)
    assert (trainer.min_epochs, trainer.min_steps, trainer.reload_dataloaders_every_n_epochs) == (1, 3, 2)
    assert policy.clip_algorithm_argument(0.5, by_value=False) is None  # the flag as given (not given: None)
    assert [policy.reload_due(e, 0) for e in range(4)] == [False, False, True, True]
    with pytest.raises(ValueError, match=r"reload_dataloaders_every_n_epochs` should be an int >= 0, got -1"):
        L.Trainer(default_root_dir=str(tmp_path / "bad"), logger=False, reload_dataloaders_every_n_epochs=-1)
