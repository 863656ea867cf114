"""Lightning's finetuning and small callbacks under their Lightning names, the same script under ``lightning`` and
``taskfit.lightning``: ``BackboneFinetuning`` (frozen backbone, then a param group of its own whose learning rate
grows each epoch), ``LambdaCallback`` and ``TQDMProgressBar`` with Lightning's constructors (F-LIT-6)."""

from __future__ import annotations

import importlib
import warnings

import torch
from harness import data
from torch.nn import functional as F


def _frameworks():
    return {name: (importlib.import_module(top), importlib.import_module(cbs)) for name, top, cbs in (
        ("lightning", "lightning", "lightning.pytorch.callbacks"),
        ("taskfit", "taskfit.lightning", "taskfit.lightning.callbacks"))}


def backbone_model(base):
    class WithBackbone(base):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh())
            self.head = torch.nn.Linear(6, 1)
            self.lrs = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.head(self.backbone(x)), y)

        def on_train_epoch_start(self):
            self.lrs.append([g["lr"] for g in self.trainer.optimizers[0].param_groups])

        def configure_optimizers(self):
            return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)
    return WithBackbone


def test_F_LIT_6_backbone_finetuning_matches_lightning(tmp_path):
    """BackboneFinetuning(unfreeze_backbone_at_epoch=1): epoch 0 trains the head (and BatchNorm) only, epoch 1 adds
    the backbone at lr x 0.1, epoch 2 doubles it; param-group learning rates, which parameters train
    and the final weights are bitwise those of Lightning."""
    seen = {}
    for name, (L, cbs) in _frameworks().items():
        torch.manual_seed(0)
        m = backbone_model(L.LightningModule)()
        trainer = L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path / name),
                            callbacks=[cbs.BackboneFinetuning(unfreeze_backbone_at_epoch=1)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(m, data())
        seen[name] = (m.lrs, [p.requires_grad for p in m.parameters()], [p.detach().clone() for p in m.parameters()])
    (llr, lrg, lw), (tlr, trg, tw) = seen["lightning"], seen["taskfit"]
    assert tlr == llr
    assert [len(g) for g in tlr] == [1, 2, 2] and tlr[2][1] == tlr[1][1] * 2.0
    assert trg == lrg
    assert all(torch.equal(a, b) for a, b in zip(lw, tw))


def test_F_LIT_6_lambda_callback_and_tqdm_progress_bar_constructors(tmp_path):
    """LambdaCallback takes Lightning's hook keywords (None for a hook not given) and TQDMProgressBar
    refresh_rate/process_position/leave; the lambdas see the same epochs."""
    from harness import linear

    seen = {}
    for name, (L, cbs) in _frameworks().items():
        epochs = []
        torch.manual_seed(0)
        m = linear(L.LightningModule)()
        bar = cbs.TQDMProgressBar(refresh_rate=0, process_position=0, leave=True)
        lam = cbs.LambdaCallback(
            on_train_epoch_end=lambda trainer, module, seen=epochs: seen.append(trainer.current_epoch),
            on_fit_start=None)
        trainer = L.Trainer(max_epochs=2, logger=False, enable_model_summary=False, enable_checkpointing=False,
                            default_root_dir=str(tmp_path / name), callbacks=[bar, lam])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(m, data())
        seen[name] = (epochs, bar.refresh_rate, bar.is_disabled, trainer.progress_bar_callback is bar)
    assert seen["taskfit"] == seen["lightning"] == ([0, 1], 0, True, True)
