"""Jobs for the distributed TaskModule tests, run in fresh processes: ``python dist_job.py CONFIG.json`` (taskfit
re-launches it per rank when ``devices`` > 1). Each rank writes ``result.rank{N}.pt``.

Scenarios (``cfg["scenario"]``):
- ``"eval"``: a regressor logs its mean absolute error during validation with the default ``sync_dist`` and with
  ``sync_dist=False``; ``metric_for_best_model`` and ``EarlyStopping`` watch the synced value.
- ``"manual"``: manual optimization with two optimizers, accumulation over two batches through
  ``toggle_model(sync_grad=...)`` / ``no_backward_sync``, ``toggle_optimizer`` and ``clip_gradients``.
- ``"resume"``: manual optimization with two optimizers and two schedulers, optionally SIGKILLed after a step and
  resumed from the newest checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import linear, regression  # noqa: E402  (this folder: the job runs as a script from it)
from jobs_common import job_main, kill_callbacks  # noqa: E402

from taskfit import Callback, Fit, TaskModule  # noqa: E402
from taskfit.callbacks import EarlyStopping  # noqa: E402

SPEED = ("runtime", "per_second")
NOISE = 0.3  # the scale of the targets' noise


# kept local: the harness's Linear(4, 1) body that the Lightning scenarios run, plus its evaluation logging
class Regressor(linear(TaskModule)):
    """The Lightning scenarios' ``Linear(4, 1)`` regression, at ``lr=0.02``, logging its evaluation error."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        mae = (self.layer(x) - y).abs().mean()
        self.log("val_mae", mae)  # evaluation default: the full-set value across ranks
        self.log("val_mae_own", mae, sync_dist=False)  # this rank's share only
        self.log("val_mae_max", mae, reduce_fx="max")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02)


class SeenByCallbacks(Callback):
    """What a callback reads after each validation (EarlyStopping and checkpoint selection read the same)."""

    def __init__(self) -> None:
        self.seen: list[float] = []

        self.reference: list[float] = []

    def on_validation_end(self, fit, module):
        self.seen.append(float(fit.callback_metrics["val_mae"]))
        if not fit.strategy.shards_parameters:  # the same weights on the whole set, in this process alone
            x, y = fit.eval_reference.tensors
            with torch.no_grad():
                self.reference.append(float((module.layer(x) - y).abs().mean()))


# kept local: two sub-networks with an optimizer each, the shape manual optimization is tested on
class TwoNets(TaskModule):
    """Manual optimization with two optimizers over two sub-networks (a GAN-shaped update)."""

    def __init__(self, accumulate: int = 2, clip: float = 0.5, schedulers: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.accumulate, self.clip, self.schedulers = accumulate, clip, schedulers
        self.g = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        self.d = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.grads: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        last = (batch_idx + 1) % self.accumulate == 0
        # discriminator: accumulated over `accumulate` batches, gradients all-reduced on the last one only
        with opt_d.toggle_model(sync_grad=last):
            fake = self.g(x * 0.5).detach()
            d_loss = (F.softplus(-self.d(x)).mean() + F.softplus(self.d(fake)).mean()) / self.accumulate
            self.manual_backward(d_loss)
        if batch_idx < self.accumulate:  # the first window: this rank's local sum, then the all-reduced one
            self.grads.append(self.d[0].weight.grad.detach().clone())
        if last:
            self.clip_gradients(opt_d, gradient_clip_val=self.clip, gradient_clip_algorithm="norm")
            opt_d.step()
            opt_d.zero_grad()
        # generator: every batch, with the discriminator frozen
        self.toggle_optimizer(opt_g)
        with self.no_backward_sync(enabled=False):  # an explicit "synchronise this backward"
            g_loss = F.softplus(-self.d(self.g(x * 0.5))).mean()
            self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=0.01, gradient_clip_algorithm="value")
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        if self.schedulers and self.trainer.num_training_batches == batch_idx + 1:  # epoch end
            for s in self.lr_schedulers():
                s.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, sync_dist=True)  # training: synced when asked

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.g.parameters(), lr=1e-2)
        opt_d = torch.optim.Adam(self.d.parameters(), lr=1e-2)
        if not self.schedulers:
            return [opt_g, opt_d]
        return [opt_g, opt_d], [torch.optim.lr_scheduler.ExponentialLR(opt_g, 0.5),
                                torch.optim.lr_scheduler.StepLR(opt_d, 1, 0.7)]


def _history(fit: Fit) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(s in k for s in SPEED)} for r in fit.state.log_history]


def run(cfg: dict) -> dict:
    devices = cfg.get("devices", 1)
    common = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, seed=3, logging_steps=1,
                  per_device_train_batch_size=cfg["bs"], max_grad_norm=0.0,
                  strategy=cfg.get("strategy", "ddp" if devices > 1 else "auto"), devices=devices, ddp_timeout=60)
    common.update(cfg.get("args", {}))
    scenario = cfg["scenario"]
    torch.manual_seed(0)
    if scenario == "eval":
        seen, stop = SeenByCallbacks(), EarlyStopping(monitor="val_mae", patience=10)
        fit = Fit(callbacks=[seen, stop], num_train_epochs=3, eval_strategy="epoch", save_strategy="no",
                  per_device_eval_batch_size=cfg.get("eval_bs", 4), metric_for_best_model="val_mae",
                  greater_is_better=False, **common)
        module = Regressor()
        fit.eval_reference = regression(cfg.get("n_eval", 18), seed=1, noise=NOISE)
        fit.fit(module, regression(32, seed=0, noise=NOISE), fit.eval_reference)
        return {"history": _history(fit), "seen": seen.seen, "reference": seen.reference, "best_metric": fit.state.best_metric,
                "early_stopping_best": float(stop.best), "weights": module.state_dict(), "rank": fit.global_rank,
                "eval": fit.validate(module, regression(cfg.get("n_eval", 18), seed=1, noise=NOISE))}
    fit = Fit(callbacks=kill_callbacks(cfg), max_steps=cfg.get("steps", 8),
              save_strategy="steps" if scenario == "resume" else "no", save_steps=4, **common)
    module = TwoNets(schedulers=scenario == "resume")
    fit.fit(module, regression(48, seed=2, noise=NOISE),
            resume_from_checkpoint=cfg.get("resume", True if scenario == "resume" else None))
    return {"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
            "optimizers": [o.state_dict() for o in fit.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in fit.lr_scheduler_configs],
            "history": _history(fit), "global_step": fit.state.global_step, "rank": fit.global_rank,
            "grads": module.grads}


if __name__ == "__main__":
    job_main(run)
