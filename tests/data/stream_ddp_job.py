"""A DDP job for the streaming-resume test, run in fresh processes: ``python stream_ddp_job.py CONFIG.json``
(taskfit re-launches it per rank). Each rank reads its own share of a stateful stream (or, with ``"loader":
"torchdata"``, of map-style rows through torchdata's ``StatefulDataLoader``) and writes what it trained on and how
many samples it loaded to ``{result}.rank{r}.json``."""

from __future__ import annotations

import json
import os
import sys

import torch
from stream_common import (  # each of the 2 ranks reads 8 samples (4 batches of 2 per pass)
    N,
    Recorder,
    stream_samples,
)
from taskfit import Fit
from torch.utils.data import IterableDataset


class RankStream(IterableDataset):
    """This rank's samples (``i % world_size == rank``) in an order drawn from the epoch and the rank; its
    ``state_dict`` is the position in the pass, ``fetched`` counts the samples it produced."""

    def __init__(self) -> None:
        self.rank, self.world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        self.x, self.y = stream_samples()
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


class Rows(torch.utils.data.Dataset):
    """The stream's samples as map-style rows; ``fetched`` counts the rows loaded in this process."""

    def __init__(self) -> None:
        self.x, self.y = stream_samples()
        self.fetched = 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        self.fetched += 1
        return {"idx": torch.tensor(i), "x": self.x[i], "y": self.y[i]}


def torchdata_loader(rows: Rows):
    """torchdata's ``StatefulDataLoader`` over ``rows`` in a fixed shuffled order (taskfit gives each rank its share
    of it). Not a ``RandomSampler``: taskfit's split re-reads the sampler it wraps when torchdata fast-forwards it,
    and a ``RandomSampler``'s generator then gives the resumed pass another order."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    order = torch.randperm(N, generator=torch.Generator().manual_seed(7)).tolist()
    return StatefulDataLoader(torch.utils.data.Subset(rows, order), batch_size=2)


def random_loader(rows: Rows, kind: str):
    """A loader over ``rows`` shuffled by a ``RandomSampler`` with its own seeded generator (a plain ``DataLoader``,
    or torchdata's ``StatefulDataLoader`` with ``kind="torchdata_random"``); taskfit splits its order per rank."""
    sampler = torch.utils.data.RandomSampler(rows, generator=torch.Generator().manual_seed(7))
    if kind == "torchdata_random":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(rows, batch_size=2, sampler=sampler)
    return torch.utils.data.DataLoader(rows, batch_size=2, sampler=sampler)


if __name__ == "__main__":
    with open(sys.argv[-1]) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    fit = Fit(output_dir=cfg["out"], max_steps=cfg["steps"], per_device_train_batch_size=2, save_steps=cfg["save"],
              save_strategy="steps", disable_tqdm=True, report_to="none", lr_scheduler_type="constant",
              strategy="ddp", devices=2, ddp_timeout=120)
    module = Recorder()
    kind = cfg.get("loader")
    stream = Rows() if kind else RankStream()
    data = torchdata_loader(stream) if kind == "torchdata" else random_loader(stream, kind) if kind else stream
    fit.fit(module, data, resume_from_checkpoint=cfg.get("resume"))
    with open(cfg["result"] + f".rank{fit.global_rank}.json", "w") as f:
        json.dump({"seen": module.seen, "fetched": stream.fetched, "weight": module.layer.weight.tolist()}, f)
