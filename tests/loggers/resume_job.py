"""A training job for the logger resume tests: ``python resume_job.py OUT_DIR [KILL_STEP]`` trains a small
regression with every logger on (csv, tensorboard, mlflow, wandb offline), resuming from the newest checkpoint
in ``OUT_DIR``; with ``KILL_STEP`` it flushes every logger and SIGKILLs itself after that optimizer step."""

from __future__ import annotations

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import SumRegression  # noqa: E402
from jobs_common import sum_data as regression_data  # noqa: E402

from taskfit import Callback, Fit  # noqa: E402


class Net(SumRegression):
    """Logs the user's own per-step ``train_loss`` and a validation ``val_loss`` / ``val_mae``."""

    train_metric = "train_loss"
    return_val_loss = True


class FlushAndKill(Callback):
    """After optimizer step ``step``: write out what every logger holds, then die as a pre-empted job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not control.should_save and not control.should_log:
            for lg in self.fit.loggers:
                if hasattr(lg, "save"):
                    lg.save()
                if getattr(lg, "_writer", None) is not None:
                    lg._writer.flush()
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    out, kill = sys.argv[1], (int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    torch.set_num_threads(1)
    cb = [FlushAndKill(kill)] if kill else []
    fit = Fit(output_dir=out, report_to="all", run_name="resumed-run", max_steps=12, logging_steps=2,
              eval_strategy="steps", eval_steps=3, save_steps=4, per_device_train_batch_size=2,
              per_device_eval_batch_size=4, learning_rate=0.05, seed=3, disable_tqdm=True, callbacks=cb)
    for c in cb:
        c.fit = fit
    fit.fit(Net(), regression_data(16), regression_data(8, 1), resume_from_checkpoint=True)
