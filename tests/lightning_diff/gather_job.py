"""Job for the all_gather test: ``python gather_job.py CONFIG.json`` runs one training step of a module calling
``self.all_gather`` under ``cfg["framework"]``'s Trainer (``lightning`` or ``taskfit``) with DDP on 2 CPU processes
(each framework re-launches the script per rank); each rank saves what it gathered."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import data, linear  # this folder: the job runs as a script from it
from jobs_common import job_main


def run(cfg: dict) -> dict:
    L = importlib.import_module("lightning" if cfg["framework"] == "lightning" else "taskfit.lightning")

    class Gather(linear(L.LightningModule)):
        def training_step(self, batch, batch_idx):
            # each rank's own values (not the batch: the two frameworks shard the data differently)
            x = torch.arange(8.0).view(2, 4) * (self.global_rank + 1)
            self.got = self.all_gather({"x": x, "rank": self.global_rank})
            grad_x = x.clone().requires_grad_(True)
            self.all_gather(grad_x, sync_grads=True).sum().backward()
            self.grad = grad_x.grad.clone()
            return super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    m = Gather()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=cfg["out"])
    trainer.fit(m, data(n=16, batch_size=4))
    return {"rank": trainer.global_rank, "x": m.got["x"], "ranks": m.got["rank"], "grad": m.grad}


if __name__ == "__main__":
    job_main(run)
