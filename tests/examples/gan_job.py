"""The Fashion-MNIST GAN example as a job that may SIGKILL itself: ``python gan_job.py CONFIG.json``. Trains the
example's two-optimizer, two-scheduler manual-optimization module (resuming with ``resume_from_checkpoint=True``)
and writes its final weights, optimizer and scheduler states and log history to ``config["result"]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from taskfit import Fit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from example_files import load_example  # noqa: E402  (this folder: the job runs as a script from it)
from jobs_common import kill_callbacks  # noqa: E402

SPEED = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


def run(cfg: dict) -> dict:
    gan = load_example("fashion_mnist_gan")
    fit = Fit(output_dir=cfg["output_dir"], max_steps=15, per_device_train_batch_size=32, logging_steps=2,
              save_strategy="steps", save_steps=4, seed=3, report_to="none", disable_tqdm=True,
              callbacks=kill_callbacks(cfg))
    torch.manual_seed(0)
    module = gan.GAN(hidden=64, gamma=0.5)
    fit.fit(module, gan.gan_data("auto", 192, 0), resume_from_checkpoint=cfg.get("resume", True))
    return {"weights": {k: v.clone() for k, v in module.state_dict().items()},
            "optimizers": [o.state_dict() for o in fit.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in fit.lr_scheduler_configs],
            "log_history": [{k: v for k, v in r.items() if k not in SPEED} for r in fit.state.log_history],
            "global_step": fit.state.global_step}


if __name__ == "__main__":
    config = json.loads(Path(sys.argv[1]).read_text())
    torch.save(run(config), config["result"])
