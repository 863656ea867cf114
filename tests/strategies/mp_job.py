"""Jobs for the model-parallel and resharding tests, run in fresh processes: ``python mp_job.py CONFIG.json``
(taskfit re-launches it per rank when ``devices`` > 1). Writes ``result.rank{r}.pt`` with the full final weights
(``fit.save_model``), the log history, the parameter types and the mesh.

The model: a tiny transformer-ish language model, token embedding -> 2 blocks (``up``: Linear H -> 4H, ``down``:
Linear 4H -> H, residual) -> head. Its tensor-parallel plan is the Megatron one: ``up`` column-wise, ``down``
row-wise. ``LM`` parallelises itself in ``configure_model`` (and ``fully_shard``s each block over the
data-parallel mesh when there is one); ``PlanLM`` does not override ``configure_model``: its model declares a
``tp_plan`` (as HF models do) that the strategy applies.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch import nn

from taskfit import Callback, Fit, TaskModule

V, H, T = 11, 8, 6


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(H, 4 * H)
        self.down = nn.Linear(4 * H, H)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class TinyLM(nn.Module):
    tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}  # HF models' form

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(H, V)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


# kept local: wraps TinyLM, whose tp_plan the strategy applies
class PlanLM(TaskModule):
    """No configure_model: the strategy applies ``TinyLM.tp_plan``."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = TinyLM()

    def training_step(self, batch, batch_idx):
        logits = self.lm(batch["ids"])
        return nn.functional.cross_entropy(logits.reshape(-1, V), batch["labels"].reshape(-1))


class LM(PlanLM):
    """Parallelises itself on the device mesh (Lightning's ModelParallelStrategy pattern)."""

    def configure_model(self):
        mesh = self.device_mesh
        if mesh is None:  # another strategy: nothing to parallelise
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        for block in self.lm.blocks:
            parallelize_module(block, mesh["tensor_parallel"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if mesh["data_parallel"].size() > 1:
            for block in self.lm.blocks:
                fully_shard(block, mesh=mesh["data_parallel"])


def hf_llama() -> nn.Module:
    """A tiny randomly initialised HF Llama (no download); it declares a ``tp_plan``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T))


def samples(n: int = 32, seed: int = 0, hf: bool = False) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, V, (T,), generator=g)
        out.append({"input_ids": ids, "labels": ids} if hf else {"ids": ids, "labels": (ids * 3 + 1) % V})
    return out


class Observe(Callback):
    """Records the parameter types after set-up and SIGKILLs every rank after step ``kill``."""

    def __init__(self, kill: int | None) -> None:
        self.kill, self.param_types, self.positions = kill, {}, []

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.param_types = {n: type(p).__name__ for n, p in model.named_parameters()}

    def on_step_end(self, args, state, control, **kw):
        self.positions.append((state.current_epoch, state.batch_in_epoch))  # where in the data each step ended
        if self.kill is not None and state.global_step == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)


def strategy_of(cfg: dict):
    if cfg.get("mesh"):
        from taskfit.strategies import ModelParallelStrategy

        dp, tp = cfg["mesh"]
        return ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    return cfg.get("strategy", "auto")


def run(cfg: dict) -> dict:
    obs = Observe(cfg.get("kill"))
    args = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=cfg.get("steps", 4),
                per_device_train_batch_size=cfg["bs"], learning_rate=0.05,
                gradient_accumulation_steps=cfg.get("accum", 1), logging_steps=1, save_strategy="no", seed=11,
                strategy=strategy_of(cfg), devices=cfg.get("devices", 1), ddp_timeout=60,
                remove_unused_columns=False, max_grad_norm=cfg.get("max_grad_norm", 1.0), optim="adamw_torch")
    args.update(cfg.get("args", {}))
    fit = Fit(callbacks=[obs], **args)
    torch.manual_seed(0)
    module = hf_llama() if cfg.get("hf") else (PlanLM if cfg.get("plan") else LM)()
    out = fit.fit(module, samples(hf=cfg.get("hf", False)), resume_from_checkpoint=cfg.get("resume"))
    folder = fit.save_model(os.path.join(cfg["out"], "final"))
    from safetensors.torch import load_file

    weights = load_file(os.path.join(folder, "model.safetensors")) if fit.is_global_zero else None
    s = fit.strategy
    mesh = fit.device_mesh
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    optimizer = fit._last_fit.optimizers[0]
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    osd = get_optimizer_state_dict(module, optimizer, options=full)  # name-keyed, full tensors (rank 0)
    return {"weights": weights, "loss": out.training_loss, "world_size": fit.world_size, "rank": fit.global_rank,
            "log": [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
                    for r in fit.state.log_history],
            "strategy": type(s).__name__, "param_types": obs.param_types, "positions": obs.positions,
            "mesh": tuple(mesh.shape) if mesh is not None else None,
            "mesh_names": tuple(mesh.mesh_dim_names) if mesh is not None else None,
            "module_mesh": getattr(fit._last_fit.module, "device_mesh", None) is mesh, "optim": osd if fit.is_global_zero else None,
            "plan": {k: getattr(fit.state, k) for k in ("global_step", "max_steps", "num_train_epochs", "epoch",
                                                       "samples_seen")}}


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = run(cfg)
    torch.save(result, cfg["result"].replace(".pt", f".rank{result['rank']}.pt"))
