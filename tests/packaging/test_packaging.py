"""Packaging (DESIGN.md layout): the wheel maps lib/ -> taskfit, strategies/ -> taskfit.strategies,
accelerators/ -> taskfit.accelerators, installs into a fresh virtual environment and trains there."""

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "packaging"))
import install  # noqa: E402  (the Makefile's installer: uv with pip's indexes, else pip)

SCRIPT = """
import torch, taskfit, taskfit.strategies, taskfit.accelerators
from taskfit import Fit, FitArguments, TaskModule
assert "site-packages" in taskfit.__file__, taskfit.__file__
# kept local: a user's script run against the installed wheel alone, with nothing from the checkout
class M(TaskModule):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(4, 2)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.lin(x), y)
ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
out = Fit(FitArguments(output_dir=OUT, max_steps=3, disable_tqdm=True, save_strategy="no")).fit(M(), ds)
print("STEPS", out.global_step)
"""


def _source_packages():
    pkgs = set()
    for top, name in (("lib", "taskfit"), ("strategies", "taskfit/strategies"), ("accelerators", "taskfit/accelerators")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            pkgs.add(name if str(rel) == "." else f"{name}/{rel}")
    return pkgs


def test_wheel_contents_and_fresh_venv(tmp_path):
    """The built wheel holds every package of the three source trees; installed in a fresh venv it imports
    all three packages and runs a few training steps."""
    wheel_dir = tmp_path / "wheel"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(wheel_dir)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheel_dir.glob("taskfit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert _source_packages() <= packaged, _source_packages() - packaged
    assert "taskfit/strategies/single_device.py" in names and "taskfit/accelerators/cpu.py" in names

    if os.environ.get("TASKFIT_SKIP_VENV_TEST"):
        pytest.skip("TASKFIT_SKIP_VENV_TEST is set")
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    import torch

    torch_spec = f"torch=={torch.__version__.split('+')[0]}"
    uv = install.find_uv()
    if uv is None:  # pip unpacks and compiles torch afresh: the test costs ~3x the CPU time
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        cmd, env = [str(py), "-m", "pip", "install", "-q", torch_spec, str(wheel)], None
    else:  # the same resolution from the same indexes; uv links torch's files from its cache (make install's)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        cmd, env = install.uv_command(uv, ["-q", torch_spec, str(wheel)], install.pip_settings(), python=str(py))
    inst = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-3000:]
    run = subprocess.run([str(py), "-c", f"OUT={str(tmp_path / 'out')!r}\n" + SCRIPT], capture_output=True,
                         text=True, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "STEPS 3" in run.stdout
    cli = subprocess.run([str(venv / "bin" / "taskfit"), "--version"], capture_output=True, text=True)
    assert cli.returncode == 0 and "0." in cli.stdout + cli.stderr
