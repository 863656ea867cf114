"""The job of the DDP resume test (``python door_resume_job.py CONFIG.json``; the trainer re-launches it per rank):
a Lightning-style module under ``lightning.Trainer`` or ``taskfit.lightning.Trainer`` (``cfg["framework"]``),
``strategy="ddp"``, ``devices=2`` on CPU (gloo), trained for ``cfg["max_epochs"]`` epochs with a checkpoint every
epoch, from scratch or from ``cfg["ckpt_path"]``, on 32 samples in batches of 4 (``cfg["shuffle"]``: a shuffling
loader; ``cfg["seed"]``: ``seed_everything(seed)`` first; ``cfg["use_distributed_sampler"]``: that flag). Each rank saves its weights, optimizer state, what
``on_load_checkpoint`` read, the stateful callback's state, the loop counters and what its own recording logger
received."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import data, recording_logger  # noqa: E402  (this folder: the job runs as a script from it)
from jobs_common import job_main  # noqa: E402


def run(cfg: dict) -> dict:
    if cfg["framework"] == "lightning":
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint
    else:
        import taskfit.lightning as L
        from taskfit.lightning.callbacks import ModelCheckpoint

    class Counter(L.Callback):
        """A stateful callback: the training batches it saw, over the resumed runs too."""

        def __init__(self) -> None:
            self.batches = 0
            self.seen = []  # this run's batches (the sum of each batch's inputs)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1
            self.seen.append(round(float(batch[0].sum()), 4))

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state):
            self.batches = state["batches"]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = None
            self.loaded = None
            self.layer_at_load = None

        def configure_model(self):  # the weights exist only after this hook, which runs before the restore
            if self.layer is None:
                torch.manual_seed(0)
                self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.layer(x), y)
            self.log("loss", loss)  # this rank's own value
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["door_extra"] = {"saved_at": self.trainer.global_step}

        def on_load_checkpoint(self, checkpoint):
            self.loaded = checkpoint["door_extra"]
            self.layer_at_load = self.layer is not None

    if cfg.get("seed") is not None:
        L.seed_everything(cfg["seed"])  # its PL_GLOBAL_SEED seeds Lightning's distributed sampler
    loader = data(32)
    if cfg.get("shuffle"):  # a shuffling loader: Lightning replaces its RandomSampler by a DistributedSampler
        loader = torch.utils.data.DataLoader(loader.dataset, batch_size=4, shuffle=True)
    counter = Counter()
    logger = recording_logger()  # a logger of the user's own: called on every process, as Lightning calls it
    trainer = L.Trainer(default_root_dir=cfg["out"], accelerator="cpu", devices=2, strategy="ddp",
                        use_distributed_sampler=cfg.get("use_distributed_sampler", True),
                        max_epochs=cfg["max_epochs"], logger=logger, log_every_n_steps=1, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[counter, ModelCheckpoint(dirpath=cfg["out"] + "/ckpt", save_top_k=-1)])
    module = Module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader, ckpt_path=cfg.get("ckpt_path"))
    opt = trainer.optimizers[0].state_dict()
    return {"rank": trainer.global_rank, "weights": {k: v.clone() for k, v in module.state_dict().items()},
            "momentum": [opt["state"][i]["momentum_buffer"].clone() for i in sorted(opt["state"])],
            "loaded": module.loaded, "layer_at_load": module.layer_at_load, "batches": counter.batches,
            "seen": counter.seen,
            "global_step": trainer.global_step, "epoch": trainer.current_epoch, "rows": logger.rows}


if __name__ == "__main__":
    job_main(run)
