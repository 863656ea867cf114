"""Issue 31: ``strategy="ddp_spawn"`` called from a script's top level without the ``if __name__ == "__main__":``
guard used to hang (each spawned child re-runs the script, dies on Python's bootstrapping error, and the parent
blocks writing a payload larger than a pipe buffer). The launcher now refuses at once, with the fix in the message;
the same script with the guard trains."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from taskfit import Fit, TaskModule


# the script a user would write (a one-layer regression), carrying a large buffer as the payload
class Net(TaskModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.register_buffer("big", torch.zeros(256, 256))  # a payload larger than a pipe buffer (made the parent block)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)


def main():
    x = torch.randn(16, 3)
    fit = Fit(strategy="ddp_spawn", devices=2, accelerator="cpu", max_steps=2, per_device_train_batch_size=4,
              output_dir=OUT, report_to="none", disable_tqdm=True, save_strategy="no")
    fit.fit(Net(), TensorDataset(x, x.sum(-1)))
    print("TRAINED")

'''


def _run(tmp_path, tail: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("OUT", repr(str(tmp_path / "out"))) + textwrap.dedent(tail))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script)], check=False, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=180)


def test_ddp_spawn_without_main_guard_fails_fast_with_the_fix(tmp_path):
    proc = _run(tmp_path, "main()\n")
    assert proc.returncode != 0 and "TRAINED" not in proc.stdout
    assert 'if __name__ == "__main__":' in proc.stderr and "ddp_spawn" in proc.stderr
    assert "train.py" in proc.stderr  # names the script and its line
    assert "bootstrapping" not in proc.stderr  # refused in the parent, before any child started


@pytest.mark.distributed
def test_ddp_spawn_with_main_guard_trains(tmp_path):
    proc = _run(tmp_path, 'if __name__ == "__main__":\n    main()\n')
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRAINED" in proc.stdout
