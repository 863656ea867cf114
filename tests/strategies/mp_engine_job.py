"""A hand-written loop on ``Engine`` with tensor parallelism the user applies, run in fresh processes:
``python mp_engine_job.py CONFIG.json`` (the Engine re-launches it per rank when ``tp`` > 1). The model is
``mp_job.TinyLM``; the user's ``parallelize`` splits its blocks (``up`` column-wise, ``down`` row-wise) on the
mesh's ``"tensor_parallel"`` dimension.

Config keys: ``tp`` (processes; 1: a plain loop in this process, the reference), ``how`` (``"own_code"``: the
loop parallelises the model on ``engine.device_mesh`` right after ``launch()``, before ``setup``;
``"parallelize_fn"``: ``ModelParallelStrategy(parallelize_fn=parallelize)``, Lightning Fabric's form), ``steps``,
``bs``, ``clip`` (``"norm"`` or ``"value"``), ``result``. Writes ``{result}.rank{r}.pt``: full final weights, losses,
what the mesh looked like before ``setup`` and the parameter types after it.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

from mp_job import V, TinyLM, samples


def parallelize(model: nn.Module, mesh) -> nn.Module:
    """The user's own parallelisation (Megatron plan for the blocks; embedding and head stay replicated)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model.blocks:
        parallelize_module(block, mesh["tensor_parallel"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in model.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v  # DTensor shards gathered: a collective
        out[k] = v.detach().float().clone()
    return out


def main(cfg: dict) -> dict:
    from taskfit import Engine
    from taskfit.strategies import ModelParallelStrategy

    tp, how = cfg["tp"], cfg.get("how", "own_code")
    if tp > 1:
        fn = parallelize if how == "parallelize_fn" else None
        engine = Engine(accelerator="cpu", devices=tp, ddp_timeout=60, strategy=ModelParallelStrategy(
            data_parallel_size=1, tensor_parallel_size=tp, parallelize_fn=fn))
    else:
        engine = Engine(accelerator="cpu", devices=1)
    engine.launch()
    mesh = engine.device_mesh  # built by launch(), before any setup
    seen = {"mesh": tuple(mesh.shape) if mesh is not None else None,
            "mesh_names": tuple(mesh.mesh_dim_names) if mesh is not None else None,
            "strategy_mesh": engine.strategy.device_mesh is mesh if mesh is not None else None}
    torch.manual_seed(0)
    model = TinyLM()
    if mesh is not None and how == "own_code":
        model = parallelize(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = engine.setup(model, optimizer)
    seen["param_types"] = {n: type(p).__name__ for n, p in model.module.named_parameters()}
    loader = engine.setup_dataloaders(DataLoader(samples(), batch_size=cfg["bs"]))
    losses, norms = [], []
    for step, batch in zip(range(cfg["steps"]), loader):
        logits = model(batch["ids"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), batch["labels"].reshape(-1))
        engine.backward(loss)
        if cfg.get("clip") == "value":
            engine.clip_gradients(model, optimizer, clip_val=0.01)
        else:
            norms.append(float(engine.clip_gradients(model, optimizer, max_norm=1.0)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    out = {"weights": full_weights(model.module), "losses": losses, "norms": norms, "rank": engine.global_rank,
           **seen}
    engine.teardown()
    return out


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = main(cfg)
    torch.save(result, cfg["result"].replace(".pt", f".rank{result['rank']}.pt"))
