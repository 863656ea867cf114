"""HF override points under real multi-process strategies (F-HF-1, F-STRAT-2, F-STRAT-6): a ``taskfit.hf.Trainer``
subclass overriding ``get_train_dataloader``, ``create_optimizer``, ``training_step`` and ``evaluate`` runs on 2 gloo
processes (DDP and FSDP, taskfit re-launching the script per rank); every rank calls every override, and the
``training_step`` override (loss x 3, its own backward through the wrapper) trains exactly as SGD with a 3x
learning rate does without it. A subclass overriding every HF override point runs under DDP and DeepSpeed ZeRO-2
(2 processes): each rank records the same calls in HF's order under both, and its ``training_step`` override
(labels + 1, then the default step: backward through the DeepSpeed engine) trains exactly as the same labels
given by a collator. Under a DeepSpeed config with an ``optimizer`` section, ``create_optimizer`` /
``create_scheduler`` see placeholders (HF: accelerate's ``DummyOptim`` / ``DummyScheduler``) and an override that
builds its own optimizer is refused before training, as HF's accelerate refuses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8 two-process jobs and 2 one-process ones, ~4 min
JOB = Path(__file__).parent / "overrides_ddp_job.py"
ALL_JOB = Path(__file__).parent / "overrides_all_job.py"


def _run(tmp_path: Path, mode: str, strategy: str, job: Path = JOB, devices: int = 2) -> list[dict]:
    out = tmp_path / f"{mode}-{strategy}"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                          "MASTER_PORT", "TASKFIT_LAUNCHED")}
    extra = [] if job == JOB else [str(devices)]
    proc = subprocess.run([sys.executable, str(job), mode, str(out), strategy, *extra], capture_output=True,
                          text=True, timeout=400, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "1", "TASKFIT_DEEPSPEED_SHM_COMM": "0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_overrides_called_in_every_worker_F_HF_1(strategy, tmp_path):
    """F-HF-1: each rank's loader is its share (32 samples / 2 ranks / batch 4 = 4 batches) from the
    get_train_dataloader override, the override's SGD trains, training_step runs per micro-batch on each rank and
    the evaluations during training (every 2 steps) go through the evaluate override."""
    ranks = _run(tmp_path, "override", strategy)
    reference = _run(tmp_path, "reference", strategy)
    expected = ([["get_train_dataloader", 4], ["create_optimizer", True]]
                + ([["training_step", 4]] * 2 + [["evaluate", ["epoch", "eval_loss"]]]) * 2)
    for r in ranks:
        assert r["world_size"] == 2 and r["calls"] == expected
        assert r["weights"] == ranks[0]["weights"]  # replicas stay identical
    assert [r["calls"] for r in reference] == [[["create_optimizer", True]]] * 2
    # loss x 3 in training_step == learning rate x 3 (plain SGD, no clipping): the override changed the training
    for name, value in ranks[0]["weights"].items():
        got, ref = _scalar(value), _scalar(reference[0]["weights"][name])
        assert abs(got) > 0.1 and abs(got - ref) <= 1e-6, (name, got, ref)


def _scalar(value: list) -> float:
    """The one number of a ``[[w]]`` weight or ``[b]`` bias list."""
    while isinstance(value, list):
        value = value[0]
    return value


def _expected_all_calls() -> list:
    """What each of 2 ranks records, in HF 5's order (test_overrides_points' single-process run of the same
    subclass equals transformers'): 32 samples / 2 ranks / batch 4 = 4 steps, a log and an evaluation
    (16 / 2 / 4 = 2 batches, loss only) every 2 steps, the train summary row, then predict over 8 samples (1 batch
    per rank, all 8 predictions gathered). Each log() override sees the row before log() adds the epoch, and its
    copy of the row leaves evaluate()'s metrics without one, as in HF. Without clipping (``max_grad_norm=0``) the
    row still has ``grad_norm`` (under DeepSpeed the engine's global norm), as in HF."""
    window = [["training_step", 4]] * 2 + [
        ["log", ["grad_norm", "learning_rate", "loss"]],
        ["get_eval_dataloader", 2],
        ["prediction_step", 4, True], ["prediction_step", 4, True], ["log", ["eval_loss"]],
        ["evaluate", ["eval_loss"]]]
    return ([["get_train_dataloader", 4], ["create_optimizer", "None"], ["create_scheduler", 4, "None"]]
            + window * 2 + [["log", ["train_loss"]], ["get_test_dataloader", 1],
                            ["prediction_step", 4, False], ["predict", [8]]])


@pytest.mark.deepspeed
@pytest.mark.parametrize("strategy", ["ddp", "deepspeed_stage_2"])
def test_every_override_point_under_ddp_and_deepspeed_F_HF_1(strategy, tmp_path):
    """F-HF-1, F-STRAT-6: every override point of a subclass is called on every rank in HF's order (DDP and
    DeepSpeed ZeRO-2 alike; create_optimizer_and_scheduler never, as in HF 5), the log override's rows reach
    log_history, and the training_step override changes the training exactly as labels + 1 from a collator do."""
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed")
    ranks = _run(tmp_path, "override", strategy, ALL_JOB)
    reference = _run(tmp_path, "reference", strategy, ALL_JOB)
    for r in ranks:
        assert r["world_size"] == 2 and r["calls"] == _expected_all_calls()
        assert r["weights"] == ranks[0]["weights"]  # replicas stay identical
        assert all("calls" in row for row in r["log_history"])  # the log override's key, in every row
    assert [r["calls"] for r in reference] == [[["create_optimizer", "None"], ["create_scheduler", 4, "None"]]] * 2
    assert ranks[0]["weights"] == reference[0]["weights"]  # the override trained (labels + 1), nothing else changed
    assert ranks[0]["optimizer"] == "SGD"


@pytest.mark.deepspeed
def test_create_optimizer_with_a_deepspeed_optimizer_section_F_HF_1(tmp_path):
    """F-HF-1, F-STRAT-6: with an ``optimizer`` section in the DeepSpeed config (1 process), overrides that defer to
    ``super()`` find placeholders in ``self.optimizer`` / ``self.lr_scheduler`` (HF: ``DummyOptim`` /
    ``DummyScheduler``) and DeepSpeed's optimizer trains; an override building its own optimizer is refused
    before training (HF: accelerate's "You cannot specify an optimizer in the config file and in the code")."""
    pytest.importorskip("deepspeed")
    (ok,) = _run(tmp_path, "ds_optimizer", "deepspeed", ALL_JOB, devices=1)
    assert ok["error"] is None and ok["calls"] == [
        ["create_optimizer", "<optimizer built by the DeepSpeed engine>"],
        ["create_scheduler", 8, "<LR scheduler built by the DeepSpeed engine>"]]
    assert ok["optimizer"] == "AdamW" and _scalar(ok["weights"]["lin.weight"]) != 0.0
    (own,) = _run(tmp_path, "ds_optimizer_own", "deepspeed", ALL_JOB, devices=1)
    assert "DeepSpeed config has an 'optimizer' section" in own["error"] and "an optimizer" in own["error"]
    assert own["log_history"] == [] and _scalar(own["weights"]["lin.weight"]) == 0.0
