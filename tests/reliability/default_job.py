"""The default-options matrix's job (``python default_job.py CONFIG.json``; taskfit re-launches it per rank when
``devices`` > 1): one small model trained through one door with DEFAULT arguments only. Only what a run strictly
needs is set: ``output_dir``, a small ``max_steps``, the strategy name and ``devices`` (and, for FSDP's sharding
variants, ``fsdp=<variant>``, in ``cfg["options"]``). Rank 0 writes
``result.rank0.pt`` with the final full weights, read back from what the door saves (``save_model``), or, for
``Engine``, from the module.

The model: ``up`` Linear(4, 8) -> tanh -> ``down`` Linear(8, 1), regressing ``x.sum(-1)``. The data has exactly
one global batch (``8 x cfg["world"]`` samples: the default ``per_device_train_batch_size`` 8 times the processes
that read different samples), so every step is a full-batch step and the reference (:func:`reference`) does not depend on the sampler's order.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from taskfit import TaskModule
from torch import nn
from torch.utils.data import TensorDataset

BATCH = 8  # FitArguments' default per_device_train_batch_size


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x, labels=None):
        pred = self.down(torch.tanh(self.up(x))).squeeze(-1)
        return pred if labels is None else {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


# kept local: an MLP with up/down projections that tensor parallelism splits
class Regression(TaskModule):
    """The model as a TaskModule; under ``model_parallel`` ``up`` is split column-wise and ``down`` row-wise."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP()

    def configure_model(self):
        if self.device_mesh is None:
            return
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(self.net, self.device_mesh["tensor_parallel"],
                           {"up": ColwiseParallel(), "down": RowwiseParallel()})

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH * world, 4, generator=torch.Generator().manual_seed(1))
    return x, x.sum(-1)


def reference(world: int, steps: int, schedule: bool = True) -> dict[str, torch.Tensor]:
    """Plain torch: full-batch AdamW with HF's defaults (lr 5e-5, betas (0.9, 0.999), eps 1e-8, no weight
    decay), a linear decay to 0 over ``steps`` (``lr_scheduler_type="linear"``, no warmup) when ``schedule``."""
    model = MLP()
    x, y = data(world)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (steps - s) / steps) if schedule else 1.0)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _saved(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights = load_file(os.path.join(folder, "model.safetensors"))
    return {k.removeprefix("net."): v for k, v in weights.items()}


def run_fit(cfg: dict) -> dict:
    from taskfit import Fit

    fit = Fit(output_dir=cfg["out"], max_steps=cfg["steps"], strategy=cfg["strategy"], devices=cfg["devices"],
              **cfg.get("options", {}))
    out = fit.fit(Regression(), TensorDataset(*data(cfg["world"])))
    folder = fit.save_model(os.path.join(cfg["out"], "final"))
    weights = _saved(folder) if fit.is_global_zero else None
    return {"weights": weights, "rank": fit.global_rank, "steps": out.global_step, "optim": fit.args.optim}


def run_hf(cfg: dict) -> dict:
    from taskfit.hf import Trainer, TrainingArguments

    x, y = data(cfg["world"])
    rows = [{"x": a, "labels": b} for a, b in zip(x, y)]
    args = TrainingArguments(output_dir=cfg["out"], max_steps=cfg["steps"], strategy=cfg["strategy"],
                             devices=cfg["devices"], **cfg.get("options", {}))
    trainer = Trainer(model=MLP(), args=args, train_dataset=rows)
    out = trainer.train()
    trainer.save_model(os.path.join(cfg["out"], "final"))
    weights = _saved(os.path.join(cfg["out"], "final")) if trainer.is_world_process_zero() else None
    return {"weights": weights, "rank": trainer.args.process_index, "steps": out.global_step,
            "optim": trainer.args.optim}


def run_engine(cfg: dict) -> dict:
    """Engine with its defaults (strategy and devices only); the loop is the user's: full-batch AdamW(lr=5e-5)."""
    from taskfit import Engine
    from torch.utils.data import DataLoader

    engine = Engine(strategy=cfg["strategy"], devices=cfg["devices"], **cfg.get("options", {}))
    engine.launch()
    model = MLP()
    model, optimizer = engine.setup(model, torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0))
    loader = engine.setup_dataloaders(DataLoader(TensorDataset(*data(cfg["world"])), batch_size=BATCH))
    for _ in range(cfg["steps"]):
        for x, y in loader:
            engine.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    # FSDP2 holds DTensor shards: every rank joins the gather of the full tensors
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in model.state_dict().items()}
    return {"weights": {k.removeprefix("module."): v for k, v in state.items()}, "rank": engine.global_rank,
            "steps": cfg["steps"], "optim": "AdamW"}


class LitRegression(Regression):
    """The module as a Lightning user writes it: Lightning requires ``configure_optimizers`` (AdamW(lr=5e-5), no
    schedule, the same step as the Engine loop's)."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=5e-5, weight_decay=0.0)


def run_lightning(cfg: dict) -> dict:
    """``taskfit.lightning.Trainer`` with Lightning's defaults (only the root folder, the step limit, strategy and
    devices set); the weights are the module's after ``fit`` (full tensors gathered for sharded strategies)."""
    from taskfit.lightning import Trainer
    from torch.utils.data import DataLoader

    module = LitRegression()
    trainer = Trainer(default_root_dir=cfg["out"], max_steps=cfg["steps"], strategy=cfg["strategy"],
                      devices=cfg["devices"])
    trainer.fit(module, DataLoader(TensorDataset(*data(cfg["world"])), batch_size=BATCH))
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in module.net.state_dict().items()}
    return {"weights": state, "rank": trainer.global_rank, "steps": trainer.global_step, "optim": "AdamW"}


DOORS = {"fit": run_fit, "hf": run_hf, "engine": run_engine, "lightning": run_lightning}


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = DOORS[cfg["door"]](cfg)
    if result["rank"] == 0:
        torch.save(result, cfg["result"])
