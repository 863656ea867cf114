"""Jobs for the FSDP tests, run in fresh processes: ``python fsdp_job.py CONFIG.json`` (taskfit re-launches it per
rank when ``devices`` > 1). Writes ``result.rank{r}.pt`` with the full final weights (read back from
``fit.save_model``), the log history, which modules FSDP sharded, and what the run observed.

The model: embed (80 parameters) -> 2 residual ``Block`` layers (272 each, in a ``ModuleList``) -> head (51), a
token classifier whose loss is a mean over the non-ignored tokens, so micro-batches hold different numbers of
items and only exact item-count weighting across ranks matches one big batch.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from torch import nn

from taskfit import Callback, Fit, TaskModule
from token_data import CLASSES, VOCAB, token_samples

H = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Tagger(TaskModule):
    # kept local: FSDP needs blocks to wrap and shard, and the token loss ignores -100 labels
    _no_split_modules = ["Block"]  # what HF models declare; FSDP auto_wrap uses it by default

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Linear(VOCAB, H)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(H, CLASSES)

    def logits(self, x):
        h = self.drop(self.embed(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.logits(batch["x"]).reshape(-1, CLASSES).float(),
                                           batch["labels"].reshape(-1), ignore_index=-100)

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.cross_entropy(self.logits(batch["x"]).reshape(-1, CLASSES).float(),
                                           batch["labels"].reshape(-1), ignore_index=-100)
        self.log("val_ce", loss, sync_dist=True)
        return {"loss": loss}


def tokens(n: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return token_samples(n, seed)


class Observe(Callback):
    """Records the parameter types after set-up and SIGKILLs the process after step ``kill`` (every rank)."""

    def __init__(self, kill: int | None) -> None:
        self.kill, self.param_types = kill, {}

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.param_types = {n: type(p).__name__ for n, p in model.named_parameters()}

    def on_step_end(self, args, state, control, **kw):
        if self.kill is not None and state.global_step == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)


def run(cfg: dict) -> dict:
    obs = Observe(cfg.get("kill"))
    args = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=cfg.get("steps", 4),
                per_device_train_batch_size=cfg["bs"], per_device_eval_batch_size=4, learning_rate=0.05,
                gradient_accumulation_steps=cfg.get("accum", 1), logging_steps=cfg.get("logging_steps", 1),
                save_strategy="no", seed=11,
                strategy=cfg.get("strategy", "auto"), devices=cfg.get("devices", 1), ddp_timeout=60,
                remove_unused_columns=False, max_grad_norm=cfg.get("max_grad_norm", 1.0), optim="adamw_torch")
    args.update(cfg.get("args", {}))
    fit = Fit(callbacks=[obs], **args)
    torch.manual_seed(0)
    module = Tagger(cfg.get("dropout", 0.0))
    out = fit.fit(module, tokens(), tokens(8, seed=1) if cfg.get("eval") else None,
                  resume_from_checkpoint=cfg.get("resume"))
    if cfg.get("twice"):  # fit again on the same Fit with a fresh model: a run of its own
        torch.manual_seed(0)
        module = Tagger(cfg.get("dropout", 0.0))
        out = fit.fit(module, tokens(), tokens(8, seed=1) if cfg.get("eval") else None)
    folder = fit.save_model(os.path.join(cfg["out"], "final"))
    from safetensors.torch import load_file

    weights = load_file(os.path.join(folder, "model.safetensors")) if fit.is_global_zero else None
    s = fit.strategy
    result = {"weights": weights, "loss": out.training_loss, "world_size": fit.world_size, "rank": fit.global_rank,
              "log": [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
                      for r in fit.state.log_history],
              "strategy": type(s).__name__, "wrapped": getattr(s, "wrapped_names", None),
              "param_types": obs.param_types,
              "mesh": tuple(s.mesh.shape) if getattr(s, "mesh", None) is not None else None,
              "offloaded": [str(p.device) for p in module.parameters()][:1],
              "dtypes": sorted({str(p.dtype) for p in module.parameters()})}
    if getattr(s, "options", None) is not None:
        result["options"] = vars(s.options)
        result["mp"] = str(s.mixed_precision_policy())
    if cfg.get("eval"):
        result["eval"] = fit.evaluate(tokens(8, seed=1))
    return result


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    result = run(cfg)
    torch.save(result, cfg["result"].replace(".pt", f".rank{result['rank']}.pt"))
