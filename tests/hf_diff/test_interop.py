"""Checkpoint interop with ``transformers.Trainer`` both ways (F-HF-8), single process, fp32 CPU.

A checkpoint folder written by ``transformers.Trainer`` is resumed by ``taskfit.hf.Trainer``, and one written by
taskfit is resumed by ``transformers.Trainer``; each continues exactly: the final weights equal (bitwise) those of
the uninterrupted run under either framework, and the log history equals the one transformers writes when it
resumes its own checkpoint (no loss sums cross over: the first logged loss after the resume averages the steps
since the resume, as under HF). The model has dropout, so the RNG state crosses over too. Mid-epoch and at an
epoch boundary, with a warmup-cosine schedule and gradient accumulation over an uneven epoch."""

from __future__ import annotations

import os
import pickle
import shutil
from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, assert_same, hf_names, summary  # noqa: E402

TRAIN = RegressionDataset(length=36)  # 9 batches of 4 per epoch: accumulation 2 leaves a short last window
SETTINGS = dict(save_strategy="steps", logging_steps=2, gradient_accumulation_steps=2, per_device_train_batch_size=4,
                lr_scheduler_type="cosine", warmup_steps=2, num_train_epochs=3)


class DropoutRegression(RegressionModel):
    """HF's regression model with dropout on the input: the run draws from the torch RNG every step."""

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        return super().forward(torch.nn.functional.dropout(input_x, 0.3, self.training), labels)


def _trainer(m: Any, out: str, save_steps: int) -> Any:
    m.set_seed(42)
    return m.Trainer(model=DropoutRegression(), args=args_for(m, out, save_steps=save_steps, **SETTINGS),
                     train_dataset=TRAIN)


def _resume(m: Any, source: str, out: str, save_steps: int, by_path: bool = True) -> dict[str, Any]:
    """Copy checkpoint ``source`` into a fresh ``out`` and resume from it under ``m``."""
    target = os.path.join(out, os.path.basename(source))
    shutil.copytree(source, target)
    t = _trainer(m, out, save_steps)
    t.train(resume_from_checkpoint=target if by_path else True)
    return summary(t)


# 5 optimizer steps per epoch: checkpoint-3 is mid-epoch, checkpoint-5 at the end of the first epoch
@pytest.mark.parametrize("step", [3, 5], ids=["mid_epoch", "epoch_boundary"])
def test_resume_across_frameworks_F_HF_8(step, tmp_path):
    """F-HF-8: HF checkpoint -> taskfit and taskfit checkpoint -> HF both end at the uninterrupted weights with the
    log history of HF's own resume."""
    hf, tf = hf_names("hf"), hf_names("tf")
    straight = {}
    for name, m in (("hf", hf), ("tf", tf)):
        t = _trainer(m, str(tmp_path / name), step)
        t.train()
        straight[name] = summary(t)
    assert_same(straight["hf"]["weights"], straight["tf"]["weights"])
    ckpt = f"checkpoint-{step}"
    hf_own = _resume(hf, str(tmp_path / "hf" / ckpt), str(tmp_path / "hf_hf"), step)
    # at the epoch boundary taskfit finds the HF folder itself (resume_from_checkpoint=True)
    hf_to_tf = _resume(tf, str(tmp_path / "hf" / ckpt), str(tmp_path / "hf_tf"), step, by_path=step == 3)
    tf_to_hf = _resume(hf, str(tmp_path / "tf" / ckpt), str(tmp_path / "tf_hf"), step)
    for resumed in (hf_to_tf, tf_to_hf):
        assert_same(resumed["weights"], straight["hf"]["weights"])
        assert resumed["global_step"] == straight["hf"]["global_step"]
        assert_same(resumed["log_history"], hf_own["log_history"])


def test_taskfit_folder_has_hf_files_F_HF_8(tmp_path):
    """F-HF-8: a single-process taskfit checkpoint holds the files transformers reads to resume, in HF's layout:
    HF's rng_state.pth entries, the optimizer and schedule in HF's two groups (an empty no-decay group here),
    trainer_state.json with HF's stateful_callbacks; taskfit's own files are the same tensors (no second copy of
    weights or optimizer state)."""
    import transformers

    tf = hf_names("tf")
    _trainer(tf, str(tmp_path), 3).train()
    folder = tmp_path / "checkpoint-3"
    names = set(os.listdir(folder))
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= names
    assert not names & {"pytorch_model.bin", "training_args.bin"}
    rng = torch.load(folder / "rng_state.pth", weights_only=True)  # no numpy classes needed
    own = torch.load(folder / "rng_state_0.pt", weights_only=True)
    assert set(rng) == {"python", "numpy", "cpu"} and torch.equal(rng["cpu"], own["torch"])
    opt = torch.load(folder / "optimizer.pt", weights_only=True)
    assert [g["params"] for g in opt["param_groups"]] == [[0, 1], []]
    sched = torch.load(folder / "scheduler.pt", weights_only=True)
    assert len(sched["base_lrs"]) == len(sched["lr_lambdas"]) == 2
    state = transformers.TrainerState.load_from_json(str(folder / "trainer_state.json"))
    assert state.global_step == 3 and "TrainerControl" in state.stateful_callbacks
    # an interrupted taskfit save (no manifest yet) is never taken for a transformers checkpoint
    from taskfit.io import CheckpointError, TorchCheckpointIO
    from taskfit.io.hf_checkpoint import is_hf_checkpoint
    from taskfit.checkpoint.resume import resolve_checkpoint

    (folder / "manifest.json").unlink()
    assert not is_hf_checkpoint(TorchCheckpointIO(), str(folder))
    with pytest.raises(CheckpointError, match="manifest.json"):
        resolve_checkpoint(TorchCheckpointIO(), str(tmp_path), str(folder))


class _Marker:
    """Unpickling this creates a file (a stand-in for arbitrary code in a hostile checkpoint)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def test_hostile_hf_rng_state_refused_F_HF_8(tmp_path):
    """F-HF-8: an HF folder's rng_state.pth is loaded with weights_only=True (numpy's array classes allowed, nothing
    else): a pickle that would create a file is refused before training and the file is never created."""
    from taskfit.io import UnsafeCheckpointError

    hf, tf = hf_names("hf"), hf_names("tf")
    _trainer(hf, str(tmp_path / "hf"), 3).train()
    folder = tmp_path / "hf" / "checkpoint-3"
    marker = tmp_path / "marker"
    with open(folder / "rng_state.pth", "wb") as fh:
        pickle.dump({"python": _Marker(str(marker)), "numpy": None, "cpu": None}, fh)
    t = _trainer(tf, str(tmp_path / "tf"), 3)
    with pytest.raises(UnsafeCheckpointError, match="rng_state.pth"):
        t.train(resume_from_checkpoint=str(folder))
    assert not marker.exists()
    assert t.state.global_step == 0
