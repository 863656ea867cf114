"""A training job for the signal tests: ``python interrupt_job.py CONFIG.json``. Trains the checkpoint tests'
job (dropout, shuffling, accumulation, evaluation) with ``resume_from_checkpoint=True``; ``signal_at_step``
makes it send itself ``signal`` after that optimizer step, ``slow`` sleeps that many seconds per step (so a
parent can signal it mid-run) and writes ``started`` once step 2 is done."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))
from job import Net, data, make_fit  # noqa: E402

from taskfit import Callback  # noqa: E402


class Pace(Callback):
    def __init__(self, cfg):
        self.cfg = cfg

    def on_step_end(self, args, state, control, **kwargs):
        if self.cfg.get("slow"):
            time.sleep(self.cfg["slow"])
            if state.global_step == 2 and os.environ.get("RANK", "0") == "0":
                open(self.cfg["started"], "w").close()
        if state.global_step == self.cfg.get("signal_at_step") and os.environ.get("RANK", "0") == "0":
            os.kill(os.getpid(), getattr(signal, self.cfg.get("signal", "SIGTERM")))


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    fit = make_fit(cfg)
    fit.add_callback(Pace(cfg))
    torch.manual_seed(0)
    module = Net()
    fit.fit(module, data(), data(16, seed=1), resume_from_checkpoint=cfg.get("resume", True))
    if os.environ.get("RANK", "0") == "0":
        torch.save({"weights": {k: v.detach().clone() for k, v in module.state_dict().items()},
                    "optimizer": fit.optimizer.state_dict(), "global_step": fit.state.global_step,
                    "log_history": [{k: v for k, v in r.items() if not k.endswith(("_runtime", "_per_second"))}
                                    for r in fit.state.log_history], "train_loss": fit.state.log_history[-1]["train_loss"]},
                   cfg["result"])
