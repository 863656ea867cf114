"""F-CORE-6 / F-LIT-8: the CLI as a user runs it, from the config's folder with no PYTHONPATH: the module next to
``run.yaml`` imports; ``validate|test|predict --ckpt_path last|best|PATH`` scores a checkpoint's weights (not a
fresh model); options a command would ignore are refused; under DDP the result prints once; ``taskfit convert``
turns an FSDP sharded checkpoint into full weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# kept local: the user's module file next to run.yaml, which the CLI imports without tests/ on the path
TASK = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset
from taskfit import TaskModule


class Net(TaskModule):
    def __init__(self, hidden=8):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    test_step = validation_step


def make_data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    ds = TensorDataset(x, x.sum(-1))
    return {"train": ds, "eval": ds, "test": ds}
'''


def _project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "my_task.py").write_text(TASK)
    (proj / "run.yaml").write_text(textwrap.dedent(f"""\
        module: my_task:Net
        data: my_task:make_data
        output_dir: {tmp_path / 'out'}
        per_device_train_batch_size: 8
        per_device_eval_batch_size: 16
        learning_rate: 0.05
        max_steps: 16
        save_steps: 8
        eval_strategy: steps
        eval_steps: 8
        metric_for_best_model: eval_loss
        report_to: none
        disable_tqdm: true
    """))
    return proj


def _cli(cwd, *argv, rc=0):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "taskfit.cli.app", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == rc, proc.stderr[-3000:]
    return proc


def _result(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    proj = _project(tmp)
    fit = _result(_cli(proj, "fit", "--config", "run.yaml"))
    return tmp, proj, fit


def test_module_next_to_the_config_imports_from_its_folder_and_from_elsewhere(trained, tmp_path):
    tmp, proj, fit = trained
    assert fit["train_loss"] > 0 and (tmp / "out" / "checkpoint-16" / "manifest.json").exists()
    other = tmp_path / "elsewhere"
    other.mkdir()
    out = _result(_cli(other, "validate", "--config", str(proj / "run.yaml")))  # the config's folder is searched
    assert "eval_loss" in out


def test_F_LIT_8_validate_ckpt_path_scores_the_checkpoint_not_a_fresh_model(trained):
    tmp, proj, _ = trained
    fresh = _result(_cli(proj, "validate", "--config", "run.yaml"))["eval_loss"]
    last = _result(_cli(proj, "validate", "--config", "run.yaml", "--ckpt_path", "last"))["eval_loss"]
    path = _result(_cli(proj, "test", "--config", "run.yaml", "--ckpt_path", str(tmp / "out" / "checkpoint-8")))
    best = _result(_cli(proj, "validate", "--config", "run.yaml", "--ckpt_path", "best"))["eval_loss"]
    state = json.loads((tmp / "out" / "checkpoint-16" / "trainer_state.json").read_text())
    evals = {h["step"]: h["eval_loss"] for h in state["log_history"] if "eval_loss" in h}
    assert last == pytest.approx(evals[16], rel=1e-5) and last < fresh / 2
    assert path["test_loss"] == pytest.approx(evals[8], rel=1e-5)
    assert best == pytest.approx(min(evals.values()), rel=1e-5)


def test_F_LIT_8_options_a_command_would_ignore_are_refused(trained):
    _, proj, _ = trained
    err = _cli(proj, "fit", "--config", "run.yaml", "--ckpt_path", "last", rc=2).stderr
    assert "--ckpt_path is for validate/test/predict" in err
    err = _cli(proj, "validate", "--config", "run.yaml", "--resume_from_checkpoint", "last", rc=2).stderr
    assert "Use --ckpt_path" in err
    err = _cli(proj, "validate", "--config", "run.yaml", "--ckpt_path", "nowhere", rc=2).stderr
    assert "'nowhere' is not a complete checkpoint" in err


@pytest.mark.distributed
def test_ddp_result_prints_once(trained):
    _, proj, _ = trained
    proc = _cli(proj, "validate", "--config", "run.yaml", "--ckpt_path", "last", "--strategy", "ddp", "--devices", "2")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{") and '"eval_loss"' in line
             and "eval_runtime" in line and "'" not in line]
    assert len(lines) == 1


@pytest.mark.distributed
def test_convert_fsdp_sharded_checkpoint_to_full_weights(tmp_path):
    from safetensors.torch import load_file

    proj = _project(tmp_path)
    _cli(proj, "fit", "--config", "run.yaml", "--strategy", "fsdp", "--devices", "2", "--max_steps", "8")
    ckpt = tmp_path / "out" / "checkpoint-8"
    assert not (ckpt / "model.safetensors").exists() and (ckpt / "shards" / ".metadata").exists()
    proc = _cli(proj, "convert", str(ckpt), str(tmp_path / "full"))
    weights = load_file(proc.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(proj))
    try:
        from my_task import Net
    finally:
        sys.path.remove(str(proj))
    net = Net()
    assert set(weights) == set(net.state_dict())
    net.load_state_dict(weights)
    # the converted weights score as the checkpoint itself does
    direct = _result(_cli(proj, "validate", "--config", "run.yaml", "--ckpt_path", str(ckpt)))["eval_loss"]
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert direct == pytest.approx([h["eval_loss"] for h in state["log_history"] if "eval_loss" in h][-1], rel=1e-5)
