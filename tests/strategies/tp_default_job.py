"""The tensor-parallel module of docs/strategies.md run with DEFAULT options (``python tp_default_job.py
CONFIG.json``; taskfit re-launches it per rank when ``devices`` > 1). Writes ``result.rank{r}.pt``: the full
final weights (``fit.save_model``), the training loss, the parameter types and the optimizer's group layout.

``cfg["strategy"]``: ``"object"`` (``ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)``), ``"model_parallel"`` (the name) or
``"auto"`` (one process, the reference). Only ``output_dir``, ``max_steps``, ``strategy`` and ``devices`` are
set: the optimizer is the default one (``adamw_torch_fused``)."""

from __future__ import annotations

import json
import os
import sys

import torch
from taskfit import Fit, TaskModule
from torch import nn


class Block(nn.Module):
    def __init__(self, h=8):
        super().__init__()
        self.up, self.down = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class LM(TaskModule):
    # kept local: the docs' tensor-parallel module (blocks with up/down projections split in configure_model)
    def __init__(self):
        super().__init__()
        self.embed, self.blocks, self.head = nn.Embedding(11, 8), nn.ModuleList([Block(), Block()]), nn.Linear(8, 11)

    def configure_model(self):
        mesh = self.device_mesh
        if mesh is None:  # not model parallel: nothing to split
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for block in self.blocks:
            parallelize_module(block, mesh["tensor_parallel"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            if mesh["data_parallel"].size() > 1:
                fully_shard(block, mesh=mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        h = self.embed(batch)
        for block in self.blocks:
            h = block(h)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), ((batch * 3 + 1) % 11).flatten())


def strategy_of(name: str):
    if name == "object":
        from taskfit.strategies import ModelParallelStrategy

        return ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    return name


def run(cfg: dict) -> dict:
    fit = Fit(output_dir=cfg["out"], max_steps=cfg.get("steps", 3), strategy=strategy_of(cfg["strategy"]),
              devices=cfg.get("devices", 1))
    torch.manual_seed(0)
    module = LM()
    initial = {k: v.clone() for k, v in module.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 11, (6,), generator=g) for _ in range(32)]
    out = fit.fit(module, data)
    folder = fit.save_model(os.path.join(cfg["out"], "final"))
    from safetensors.torch import load_file

    optimizer = fit._last_fit.optimizers[0]
    return {"weights": load_file(os.path.join(folder, "model.safetensors")) if fit.is_global_zero else None,
            "initial": initial, "loss": out.training_loss, "rank": fit.global_rank, "world_size": fit.world_size,
            "optim": {"name": fit.args.optim, "class": type(optimizer).__name__,
                      "groups": [{"n": len(g["params"]), "weight_decay": g["weight_decay"],
                                  "fused": g.get("fused"),
                                  "kinds": sorted({type(p).__name__ for p in g["params"]})}
                                 for g in optimizer.param_groups]},
            "param_types": {n: type(p).__name__ for n, p in fit._last_fit.module.named_parameters()}}


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = run(cfg)
    torch.save(result, cfg["result"].replace(".pt", f".rank{result['rank']}.pt"))
