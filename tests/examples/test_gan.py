"""The Fashion-MNIST GAN example (manual optimization, two optimizers, two schedulers): a short run learns, and a
run killed with SIGKILL and resumed ends bitwise equal to one that never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from example_files import load_example
from jobs_common import assert_same_state

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def gan():
    mod = load_example("fashion_mnist_gan")
    try:
        mod.load_arrays("auto")
    except FileNotFoundError as exc:
        pytest.skip(f"no image data: {exc}")
    return mod


def test_F_CORE_1_gan_example_runs_and_moves_samples_towards_the_data(gan, tmp_path):
    """40 steps on 512 real images: both losses are logged and finite, both schedules decayed once per epoch, and
    the generated images' mean moved towards the real images' mean."""
    data = gan.gan_data("auto", 512, 0)
    torch.manual_seed(0)
    before = gan.GAN().sample(256, torch.Generator().manual_seed(1))
    out = gan.main(["--max-steps", "40", "--train-size", "512", "--quiet", "--output-dir", str(tmp_path)])
    hist = out["history"]
    assert [r["step"] for r in hist] == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert all(0 < r["d_loss"] < 5 and 0 < r["g_loss"] < 5 for r in hist)
    fit = out["fit"]
    lrs = [o.param_groups[0]["lr"] for o in fit.optimizers]
    assert len(lrs) == 2 and lrs == pytest.approx([2e-4 * 0.99 ** 5] * 2, rel=1e-12)  # stepped once per epoch
    after = out["module"].sample(256, torch.Generator().manual_seed(1))
    assert after.shape == (256, 1, 28, 28) and after.min() >= -1 and after.max() <= 1
    real_mean = data.tensors[0].mean(0)
    assert (after.mean(0) - real_mean).abs().mean() < 0.9 * (before.mean(0) - real_mean).abs().mean()


def _job(cfg: dict, tmp_path: Path, name: str, expect_kill: bool = False):
    cfg = {**cfg, "result": str(tmp_path / f"{name}.pt")}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, str(HERE / "gan_job.py"), str(path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if expect_kill:
        assert proc.returncode == -9, proc.stderr[-3000:]
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(cfg["result"], weights_only=True)


def test_F_CKPT_2_gan_two_optimizers_two_schedulers_sigkill_resume_is_exact(gan, tmp_path):
    """Killed after step 10 (last checkpoint: step 8, mid-epoch of 6 batches), resumed: weights, both optimizers'
    states, both schedulers' states and the log history equal the uninterrupted run's."""
    ref = _job({"output_dir": str(tmp_path / "ref"), "resume": None}, tmp_path, "ref")
    out = str(tmp_path / "out")
    _job({"output_dir": out, "kill_after_step": 10}, tmp_path, "killed", expect_kill=True)
    assert sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))[-1] == "checkpoint-8"
    got = _job({"output_dir": out}, tmp_path, "resumed")
    assert ref["global_step"] == got["global_step"] == 15
    assert_same_state(ref, got)
    assert ref["schedulers"][0]["last_epoch"] == 2
    assert ref["log_history"] == got["log_history"]
