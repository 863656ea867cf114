"""A DDP job for the streaming-resume test, run in fresh processes: ``python stream_ddp_job.py CONFIG.json``
(taskfit re-launches it per rank). Each rank reads its own share of a stateful stream and writes what it trained on
and how many samples its stream produced to ``{result}.rank{r}.json``."""

from __future__ import annotations

import json
import os
import sys

import torch
from taskfit import Fit, TaskModule
from torch import nn
from torch.utils.data import IterableDataset

N = 16  # samples in the whole stream; each of the 2 ranks reads 8 (4 batches of 2 per pass)


class RankStream(IterableDataset):
    """This rank's samples (``i % world_size == rank``) in an order drawn from the epoch and the rank; its
    ``state_dict`` is the position in the pass, ``fetched`` counts the samples it produced."""

    def __init__(self) -> None:
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.epoch = self.fetched = self.pos = self._start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "rank": self.rank}

    def load_state_dict(self, state: dict) -> None:
        assert state["rank"] == self.rank, "another rank's state"
        self.epoch, self._start = state["epoch"], state["pos"]

    def __iter__(self):
        mine = list(range(self.rank, N, self.world))
        order = torch.randperm(len(mine), generator=torch.Generator().manual_seed(100 * self.epoch + self.rank))
        start, self._start = self._start, 0
        self.pos = start
        for j in order.tolist()[start:]:
            self.fetched += 1
            self.pos += 1
            i = mine[j]
            yield {"idx": torch.tensor(i), "x": self.x[i], "y": self.y[i]}


class Recorder(TaskModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["idx"].tolist())
        return nn.functional.mse_loss(self.layer(batch["x"]).squeeze(-1), batch["y"].float())


if __name__ == "__main__":
    with open(sys.argv[-1]) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    fit = Fit(output_dir=cfg["out"], max_steps=cfg["steps"], per_device_train_batch_size=2, save_steps=cfg["save"],
              save_strategy="steps", disable_tqdm=True, report_to="none", lr_scheduler_type="constant",
              strategy="ddp", devices=2, ddp_timeout=120)
    module, stream = Recorder(), RankStream()
    fit.fit(module, stream, resume_from_checkpoint=cfg.get("resume"))
    with open(cfg["result"] + f".rank{fit.global_rank}.json", "w") as f:
        json.dump({"seen": module.seen, "fetched": stream.fetched, "weight": module.layer.weight.tolist()}, f)
