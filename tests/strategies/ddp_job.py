"""Jobs for the DDP tests, run in fresh processes: ``python ddp_job.py CONFIG.json`` (taskfit re-launches it per
rank when ``devices`` > 1), under ``torchrun``, or imported (``ddp_spawn``)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
from torch import nn

from taskfit import Callback, Fit, TaskModule
from token_data import CLASSES, VOCAB, token_samples



# kept local: token batches with -100 labels, so ranks hold different item counts to weigh
class Tagger(TaskModule):
    """Token classifier whose loss is a mean over the non-ignored tokens (``labels != -100``): micro-batches hold
    different numbers of tokens, so only exact item-count weighting across ranks matches one big batch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(VOCAB, 16), nn.Tanh(), nn.Linear(16, CLASSES))

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["x"])
        return nn.functional.cross_entropy(logits.reshape(-1, CLASSES).float(), batch["labels"].reshape(-1),
                                           ignore_index=-100)

    def validation_step(self, batch, batch_idx):
        logits = self.net(batch["x"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, CLASSES).float(), batch["labels"].reshape(-1),
                                           ignore_index=-100)
        self.log("val_ce", loss, sync_dist=True)
        return {"loss": loss}

    def predict_step(self, batch, batch_idx):
        return self.net(batch["x"]).argmax(-1)


def tokens(n: int = 48, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return token_samples(n, seed, with_index=True)


def samples(n: int = 18, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """One label per sample: the item count of a micro-batch is its size (a Python int, equal on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(VOCAB, generator=g), "labels": torch.randint(0, CLASSES, (), generator=g)}
            for _ in range(n)]


class DieAt(Callback):
    """Rank ``rank`` exits abruptly after optimizer step ``step`` (a crashed worker)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step and int(os.environ.get("RANK", "0")) == self.rank:
            os._exit(3)


def build(cfg: dict) -> tuple[Fit, Tagger]:
    callbacks = [DieAt(*cfg["die"])] if cfg.get("die") else []
    args = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=cfg.get("steps", 6),
                per_device_train_batch_size=cfg["bs"], per_device_eval_batch_size=cfg.get("eval_bs", 5), learning_rate=0.1,
                gradient_accumulation_steps=cfg.get("accum", 1), logging_steps=2, save_strategy="no", seed=11,
                strategy=cfg.get("strategy", "auto"), devices=cfg.get("devices", 1), ddp_timeout=cfg.get("timeout", 60),
                remove_unused_columns=False)
    args.update(cfg.get("args", {}))
    fit = Fit(callbacks=callbacks, **args)
    torch.manual_seed(cfg.get("init_seed", 0) + int(os.environ.get("RANK", "0")) * cfg.get("rank_seed", 0))
    return fit, Tagger()


def run(cfg: dict) -> dict:
    fit, module = build(cfg)
    if cfg.get("eval_only"):  # validate / test / predict without a fit before them
        data = tokens(17, seed=1)
        return {"eval": fit.validate(module, data), "test": fit.test(module, data),
                "predictions": fit.predict(module, data).predictions, "world_size": fit.world_size,
                "rank": fit.global_rank}
    if cfg.get("order"):  # main_process_first: rank 0 writes its lines before any other rank starts
        with fit.args.main_process_first(desc="preparing data"):
            rank = os.environ.get("RANK", "0")
            with open(cfg["order"], "a") as f:
                f.write(f"start {rank}\n")
            time.sleep(1.0 if rank == "0" else 0)
            with open(cfg["order"], "a") as f:
                f.write(f"end {rank}\n")
    initial = {k: v.detach().clone() for k, v in module.state_dict().items()}
    train = samples(cfg["samples"]) if cfg.get("samples") else tokens()
    reduces: list[str] = []
    if cfg.get("samples"):  # record who calls the strategy's all-reduce during training
        from taskfit.strategies.ddp import DDPStrategy

        plain = DDPStrategy.reduce

        def counted(self, *a, **kw):
            reduces.append(traceback.extract_stack()[-2].name)  # the caller
            return plain(self, *a, **kw)

        DDPStrategy.reduce = counted
    out = fit.fit(module, train, tokens(17, seed=1) if cfg.get("eval") else None)
    if cfg.get("twice"):  # fit again on the same Fit with a fresh model: a run of its own
        torch.manual_seed(cfg.get("init_seed", 0) + int(os.environ.get("RANK", "0")) * cfg.get("rank_seed", 0))
        module = Tagger()
        out = fit.fit(module, tokens(), tokens(17, seed=1) if cfg.get("eval") else None)
    result = {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()}, "initial": initial,
              "loss": out.training_loss, "log": [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
                                                  for r in fit.state.log_history],
              "world_size": fit.world_size, "rank": fit.global_rank, "reduces": reduces,
              "log_level": __import__("logging").getLogger("taskfit").level}
    if cfg.get("eval"):
        result["eval"] = fit.validate(module, tokens(17, seed=1))
        result["predictions"] = fit.predict(module, tokens(17, seed=1)).predictions
    return result


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[-1]))  # the deepspeed launcher puts --local_rank=N first
    torch.set_num_threads(1)
    result = run(cfg)
    torch.save(result, cfg["result"].replace(".pt", f".rank{result['rank']}.pt"))
    if cfg.get("linger"):
        time.sleep(cfg["linger"])
