"""``trainer.progress_bar_metrics`` and ``trainer.progress_bar_callback.get_metrics(trainer, module)``: the values
logged with ``prog_bar=True`` (``logger=False`` ones too), under Lightning's names, equal under
``lightning.Trainer`` and ``taskfit.lightning.Trainer`` (F-LIT-DOOR-PBAR)."""

import warnings

import torch

from harness import data, linear


def test_F_LIT_DOOR_progress_bar_metrics_match_lightning(tmp_path):
    import lightning
    import taskfit.lightning

    got = {}
    for name, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("step_only", torch.tensor(-1.0), logger=False, prog_bar=True)
                self.log("both", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
                self.log("hidden", 5.0, prog_bar=False)
                return loss

            def on_train_epoch_end(self):
                self.log(f"epoch_{self.current_epoch}", float(self.current_epoch), logger=False, prog_bar=True)

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, accelerator="cpu", devices=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8))
        module = trainer.lightning_module if name == "lightning" else trainer.module
        got[name] = ({k: float(v) for k, v in trainer.progress_bar_metrics.items()},
                     {k: float(v) for k, v in trainer.progress_bar_callback.get_metrics(trainer, module).items()})
    assert got["taskfit"] == got["lightning"]
    assert set(got["taskfit"][0]) == {"step_only", "both_step", "both_epoch", "epoch_0", "epoch_1"}


def test_F_LIT_DOOR_num_val_batches_and_total_val_batches_match_lightning(tmp_path):
    """``trainer.num_val_batches`` (per loader, limits applied) and the bar's ``total_val_batches`` read in
    ``on_train_epoch_end`` (0 in an epoch that does not validate), as Lightning's."""
    import lightning
    import taskfit.lightning

    got = {}
    for name, L in {"lightning": lightning, "taskfit": taskfit.lightning}.items():
        seen = []

        class M(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                self.log("v", self.layer(batch[0]).sum())

            def on_train_epoch_end(self):
                seen.append(self.trainer.progress_bar_callback.total_val_batches)

        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), max_epochs=4, check_val_every_n_epoch=2,
                            limit_val_batches=3, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                            enable_model_summary=False, accelerator="cpu", devices=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8), [data(n=16), data(n=8)])
        got[name] = (list(trainer.num_val_batches), seen)
    assert got["taskfit"] == got["lightning"] == ([3, 2], [0, 5, 0, 5])
