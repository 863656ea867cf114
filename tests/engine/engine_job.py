"""A hand-written training loop on ``Engine``, run in fresh processes: ``python engine_job.py CONFIG.json`` (the
Engine re-launches it per rank when ``devices`` > 1). Each rank writes ``{result}.rank{r}.pt`` with the full final
weights, the per-step losses (averaged over ranks with ``engine.all_reduce``) and what it observed.

Config keys: ``strategy``, ``devices``, ``bs`` (micro-batch per process), ``accum``, ``steps``, ``clip`` (max norm
through ``engine.clip_gradients``), ``options`` (other ``Engine`` options), ``ckpt`` (save there after every
step), ``kill_at`` (SIGKILL itself after the save of that step), ``resume`` (load ``ckpt`` first when complete),
``reseed_after_load`` (re-seed after loading: loses the saved RNG states), ``probe_sync`` (record whether
the processes' gradients differ after the first micro-batch under ``no_backward_sync``), ``noise``
(draw input noise and dropout from the global RNG, so an exact resume needs the RNG states).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from taskfit import Engine

IN, HID, OUT = 6, 16, 3


def make_model(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights in every process and in the test's reference loop
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Dropout(dropout), nn.Linear(HID, HID), nn.Tanh(),
                         nn.Linear(HID, OUT))


def dataset(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, IN, generator=g)
    return TensorDataset(x, torch.sin(x[:, :OUT] * 2) + 0.1 * torch.randn(n, OUT, generator=g))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full tensors of every rank's parameters (FSDP's DTensors gathered: a collective)."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = v.detach().float().clone()
    return out


def main(cfg: dict) -> None:
    engine = Engine(accelerator="cpu", strategy=cfg["strategy"], devices=cfg.get("devices", 1),
                    **cfg.get("options", {}))
    engine.launch()
    bs, accum, steps = cfg["bs"], cfg["accum"], cfg["steps"]
    noise = cfg.get("noise", False)
    model = make_model(0.2 if noise else 0.0)
    model, optimizer = engine.setup(model, make_optimizer(model))
    n = bs * accum * steps * engine.world_size
    loader = engine.setup_dataloaders(DataLoader(dataset(n), batch_size=bs))
    batches = list(loader)  # this rank's micro-batches, in order: micro-batch j of step s is batches[s*accum + j]
    state = {"model": model, "optimizer": optimizer, "step": 0, "losses": []}
    ckpt = cfg.get("ckpt")
    if cfg.get("resume") and os.path.exists(os.path.join(ckpt, "manifest.json")):
        engine.load(ckpt, state)
        if cfg.get("reseed_after_load"):  # the counter-check: a resume that loses the RNG states
            torch.manual_seed(1234)
    norms, probe, start_step = [], {}, state["step"]
    while state["step"] < steps:
        step = state["step"]
        window = torch.zeros(())
        for j in range(accum):
            x, y = batches[step * accum + j]
            if noise:
                x = x + 0.05 * torch.randn_like(x)
            last = j == accum - 1
            with engine.no_backward_sync(model, enabled=not last):
                loss = nn.functional.mse_loss(model(x), y) / accum
                engine.backward(loss)
            if cfg.get("probe_sync") and step == 0 and j == 0 and accum > 1:  # inside no_backward_sync: local grads
                grad = next(model.parameters()).grad
                gathered = engine.all_gather(grad)
                probe["local_grads_differ"] = not torch.equal(gathered[0], gathered[1])
            window += loss.detach()
        if cfg.get("clip"):
            norms.append(float(engine.clip_gradients(model, optimizer, max_norm=cfg["clip"])))
        optimizer.step()
        optimizer.zero_grad()
        state["losses"] = state["losses"] + [float(engine.all_reduce(window, reduce_op="mean"))]
        state["step"] = step + 1
        if ckpt:
            engine.save(ckpt, state)
            if cfg.get("kill_at") == state["step"]:
                os.kill(os.getpid(), signal.SIGKILL)
    weights = full_weights(model)
    torch.save({"weights": weights, "losses": state["losses"], "norms": norms, "probe": probe,
                "start_step": start_step, "world_size": engine.world_size,
                "rank": engine.global_rank, "device": str(engine.device),
                "optimizer": type(optimizer.optimizer).__name__, "strategy": engine.strategy.name},
               f"{cfg['result']}.rank{engine.global_rank}.pt")
    engine.teardown()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as fh:
        main(json.load(fh))


def spawned_train(engine: Engine, steps: int) -> dict:
    """``engine.launch(spawned_train, steps)`` body (``ddp_spawn``): DDP over 2 spawned workers, batch 2 each."""
    model = make_model()
    model, optimizer = engine.setup(model, make_optimizer(model))
    loader = engine.setup_dataloaders(DataLoader(dataset(4 * steps), batch_size=2))
    for x, y in loader:
        engine.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    return {"weights": full_weights(model), "rank": engine.global_rank, "world_size": engine.world_size}
