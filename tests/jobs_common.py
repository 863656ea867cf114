"""Models, data, callbacks, the ``__main__`` (:func:`job_main`) and the result checks that several test job
scripts and their tests share. The jobs run as fresh processes, so each puts this folder on ``sys.path`` before
importing it (their tests find it there already: pytest puts tests/ on the path for its conftest)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[N]))  # N: how deep the job sits below tests/
    from jobs_common import SumRegression, sum_data

Each builder keeps the exact computation, initialisation and logged names the jobs had, so results they compare
(with peers or with other runs) are unchanged; subclasses pick the logged names through class attributes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from helpers.models import Regression
from taskfit import Callback, TaskModule


class SumRegression(Regression):
    """The canonical ``Regression``: ``nn.Linear(3, 1)`` (as ``self.layer``, initialised under
    ``torch.manual_seed(0)``) regressing ``x.sum(-1)``, with the logged names the jobs choose.

    Class attributes: ``train_metric`` (log the training MSE under this name; None: not logged), ``val_metric``
    (the validation mean absolute error's name), ``return_val_loss`` (``validation_step`` returns the MSE).
    """

    train_metric: str | None = None
    val_metric = "val_mae"
    return_val_loss = False

    def __init__(self) -> None:
        super().__init__(features=3, seed=0)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.train_metric:
            self.log(self.train_metric, loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self.layer(x).squeeze(-1)
        self.log(self.val_metric, (pred - y).abs().mean())
        return nn.functional.mse_loss(pred, y) if self.return_val_loss else None


def sum_data(n: int, seed: int = 0) -> TensorDataset:
    """``n`` samples ``x ~ N(0, 1)^3`` with target ``x.sum(-1)`` (generator seeded with ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(-1))


# kept local: dict batches {"x", "y"} through a hidden layer, the rows the architecture jobs shard and sync
class FeatureRegression(TaskModule):
    """``Linear(4, 8) -> Tanh -> Linear(8, 1)`` on dict batches ``{"x": (B, 4), "y": (B, 1)}`` (MSE).

    Class attributes: ``train_metric`` (log the training MSE under this name; None: not logged) and
    ``val_metric`` (log the validation MSE under this name with ``sync_dist=True``; None: not logged).
    ``validation_step`` returns ``{"loss": mse}``; ``predict_step`` the predictions.
    """

    train_metric: str | None = None
    val_metric: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        if self.train_metric:
            self.log(self.train_metric, loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        if self.val_metric:
            self.log(self.val_metric, loss, sync_dist=True)
        return {"loss": loss}

    def predict_step(self, batch, batch_idx):
        return self.net(batch["x"])


def feature_data(n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` dict samples ``{"x": N(0, 1)^4, "y": N(0, 1)^1}`` (generator seeded with 0)."""
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=g), "y": torch.randn(1, generator=g)} for _ in range(n)]


class KillAfterStep(Callback):
    """SIGKILL this process right after optimizer step ``step`` (when that step does not save), as a pre-empted
    job dies; in a multi-process job every rank does. The resume tests restart the job from its newest checkpoint."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not control.should_save:
            os.kill(os.getpid(), signal.SIGKILL)


def kill_callbacks(cfg: dict) -> list[Callback]:
    """``[KillAfterStep(cfg["kill_after_step"])]`` when a job's config asks for a kill (a step > 0), else ``[]``."""
    return [KillAfterStep(cfg["kill_after_step"])] if cfg.get("kill_after_step") else []


def job_main(run: Callable[[dict], dict]) -> None:
    """The ``__main__`` of a job script: read the JSON config named by the last command-line argument (launchers
    may put their own flags first), one thread per process, ``result = run(config)``, saved (``torch.save``) as
    ``config["result"]`` with ``.pt`` turned into ``.rank{result["rank"]}.pt``."""
    with open(sys.argv[-1]) as f:
        config = json.load(f)
    torch.set_num_threads(1)
    result = run(config)
    torch.save(result, config["result"].replace(".pt", f".rank{result['rank']}.pt"))


def assert_same_state(ref: dict, got: dict) -> None:
    """Two job results hold bitwise-equal ``weights`` (name -> tensor), equal state tensors in every optimizer of
    ``optimizers`` (``state_dict()`` s, in order) and equal ``schedulers`` (``state_dict()`` s): what a resumed run
    must end with. Raises AssertionError naming the first difference."""
    for k, v in ref["weights"].items():
        assert torch.equal(v, got["weights"][k]), k
    for r, g in zip(ref["optimizers"], got["optimizers"], strict=True):
        for pid, st in r["state"].items():
            for k, v in st.items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(g["state"][pid][k])), (pid, k)
    assert ref["schedulers"] == got["schedulers"]


#: what a launcher sets for its ranks: a test's own environment must not pass them on to the job it starts
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TASKFIT_LAUNCHED")


def job_env(**extra: str) -> dict[str, str]:
    """The environment for a job process: this one's without :data:`LAUNCH_VARS`, one thread per process
    (2-core machines), DeepSpeed's shared-memory collectives off (CPU gloo runs), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "TASKFIT_DEEPSPEED_SHM_COMM": "0", **extra}


def run_job(script: Path, tmp: Path, name: str, cfg: dict, *, expect_kill: bool = False,
            timeout: float = 400) -> list[dict] | None:
    """Run ``python script tmp/NAME.json`` in ``tmp`` (config ``{"out": tmp/NAME, "result": tmp/NAME.pt, **cfg}``;
    the job re-launches itself per rank when ``cfg["devices"]`` > 1 and saves ``tmp/NAME.rank{r}.pt``, as
    :func:`job_main` does). Returns every rank's result; with ``expect_kill`` asserts that the job died of SIGKILL
    and returns None. Raises AssertionError (with the job's stderr) when it failed."""
    cfg = {"out": str(tmp / name), "result": str(tmp / f"{name}.pt"), **cfg}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=timeout,
                          env=job_env(), cwd=tmp)
    if expect_kill:
        assert proc.returncode == -9, f"expected SIGKILL, got rc={proc.returncode}\n{proc.stderr[-3000:]}"
        return None
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [torch.load(tmp / f"{name}.rank{r}.pt", weights_only=False) for r in range(cfg.get("devices", 1))]
