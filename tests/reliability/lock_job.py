"""A run for the output_dir lock test: ``python lock_job.py OUTPUT_DIR STEPS STEP_SECONDS``. Trains ``STEPS``
optimizer steps, sleeping ``STEP_SECONDS`` after each, saving every step; writes ``OUTPUT_DIR/../started-{pid}``
once training began, and prints ``DONE {global_step}`` at the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402

from taskfit import Callback, Fit  # noqa: E402


class Slow(Callback):
    def __init__(self, marker: Path, seconds: float) -> None:
        self.marker, self.seconds = marker, seconds

    def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
        self.marker.touch()
        time.sleep(self.seconds)


if __name__ == "__main__":
    out, steps, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    import os

    marker = Path(out).parent / f"started-{os.getpid()}"
    torch.manual_seed(0)
    fit = Fit(output_dir=out, per_device_train_batch_size=4, max_steps=steps, save_steps=1, report_to="none",
              disable_tqdm=True, callbacks=[Slow(marker, seconds)])
    result = fit.fit(job.Net(), job.data(), resume_from_checkpoint=True)
    print("DONE", result.global_step, flush=True)
