"""Jobs for the DeepSpeed tests, run in fresh processes: ``python deepspeed_job.py CONFIG.json`` (taskfit re-launches
it per rank when ``devices`` > 1). Trains a token tagger (token-weighted losses, as in the DDP tests) and writes
each rank's result: the full weights (gathered under ZeRO-3), the initial weights, the log and what was asked
(save_model, a checkpoint)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from ddp_job import Tagger  # the token tagger of the DDP tests
from token_data import token_samples

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jobs_common import job_main, kill_callbacks  # noqa: E402

from taskfit import Fit  # noqa: E402


def tokens(n: int = 48, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return token_samples(n, seed)


def full_weights(fit: Fit, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    strategy = fit.strategy
    if getattr(strategy, "engine", None) is not None and strategy.zero_stage == 3:
        return strategy._gathered_state_dict(module)  # a collective: every rank calls it
    return {k: v.detach().float().clone() for k, v in module.state_dict().items()}


def optimizer_state(fit: Fit) -> list[torch.Tensor]:
    """This rank's optimizer state tensors (ZeRO: of its fp32 partitions), in a fixed order."""
    return [torch.as_tensor(v).clone() for st in fit.optimizer.state.values() for _, v in sorted(st.items())]


def run(cfg: dict) -> dict:
    args = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=cfg.get("steps", 6),
                per_device_train_batch_size=cfg["bs"], per_device_eval_batch_size=5, learning_rate=0.1,
                gradient_accumulation_steps=cfg.get("accum", 1), logging_steps=cfg.get("logging_steps", 1),
                save_strategy="no", seed=11,
                strategy=cfg.get("strategy", "auto"), devices=cfg.get("devices", 1), ddp_timeout=120,
                remove_unused_columns=False, max_grad_norm=cfg.get("max_grad_norm", 0.0))
    if cfg.get("save_steps"):
        args.update(save_strategy="steps", save_steps=cfg["save_steps"])
    args.update(cfg.get("args", {}))
    fit = Fit(callbacks=kill_callbacks(cfg), **args)  # every rank dies after that step
    torch.manual_seed(cfg.get("init_seed", 0) + int(os.environ.get("RANK", "0")) * cfg.get("rank_seed", 0))
    module = Tagger()
    initial = {k: v.detach().clone() for k, v in module.state_dict().items()}
    out = fit.fit(module, tokens(cfg.get("n", 48)), resume_from_checkpoint=cfg.get("resume"))
    if cfg.get("second"):  # fit again on the same Fit: new arguments (as a trial brings), a fresh model
        fit.args = fit.args.replace(**cfg["second"])
        torch.manual_seed(cfg.get("init_seed", 0) + int(os.environ.get("RANK", "0")) * cfg.get("rank_seed", 0))
        module = Tagger()
        initial = {k: v.detach().clone() for k, v in module.state_dict().items()}
        out = fit.fit(module, tokens(cfg.get("n", 48)))
    result = {"weights": {k: v.float() for k, v in full_weights(fit, module).items()}, "initial": initial,
              "loss": out.training_loss, "world_size": fit.world_size, "rank": fit.global_rank,
              "log": [{k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
                      for r in fit.state.log_history],
              "lrs": [r["learning_rate"] for r in fit.state.log_history if "learning_rate" in r],
              "optimizer_type": type(fit.optimizer).__name__, "optimizer": optimizer_state(fit),
              "global_step": fit.state.global_step,
              "engine_optimizer": type(getattr(fit.strategy, "engine", None) and fit.strategy.engine.optimizer).__name__}
    if cfg.get("save_model"):
        fit.save_model(cfg["save_model"])
    if cfg.get("eval"):
        result["eval"] = fit.validate(module, tokens(17, seed=1))
    return result


if __name__ == "__main__":
    job_main(run)
