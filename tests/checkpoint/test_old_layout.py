"""Checkpoints written before the checkpoint path moved below the strategies (``strategies/checkpointing.py``) still
load (F-CKPT-1, F-CKPT-2): the layout the current code writes is asserted equal to the one the earlier code wrote
(recorded from commit 730aac0: file names, manifest header, the keys inside each file, HF's two optimizer groups),
so a folder of the old layout is a folder of the current layout, and such a folder resumes bitwise. Fixtures from
outside the repository cannot be used in CI, hence the literal layout below."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from taskfit import Fit
from taskfit.engine import Engine

sys.path.insert(0, str(Path(__file__).parent))
import job  # noqa: E402

#: what the code before the move wrote into a one-process ``checkpoint-N`` (``save_safetensors`` default)
OLD_FIT_FILES = {"config.json", "fit_args.json", "model.safetensors", "optimizer.pt", "rng_state.pth", "rng_state_0.pt",
                 "scheduler.pt", "trainer_state.json", "training_state.pt"}
OLD_MANIFEST_KEYS = {"format", "version", "global_step", "world_size", "save_only_model", "taskfit_version",
                     "torch_version", "files"}
OLD_TRAINING_STATE_KEYS = {"callbacks", "control", "loop", "precision", "results", "state", "taskfit_version",
                           "version"}
#: since version 4 the run's plan is saved apart from ``state`` (the upgrade reads the old flat ``state`` too)
NEW_TRAINING_STATE_KEYS = OLD_TRAINING_STATE_KEYS | {"plan"}
OLD_CONFIG_KEYS = {"class", "hyper_parameters", "num_parameters", "taskfit_version"}
#: ``Engine.save`` of ``{"model", "optimizer", "step", "extra"}``
OLD_ENGINE_FILES = {"config.json", "fit_args.json", "model.safetensors", "optimizer.pt", "rng_state_0.pt",
                    "trainer_state.json", "training_state.pt"}


def _fit(out: Path, steps: int) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, max_steps=steps, save_steps=2)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_F_CKPT_1_fit_checkpoint_layout_is_the_old_one(tmp_path):
    torch.manual_seed(0)
    _fit(tmp_path / "out", 2).fit(job.Net(), job.data())
    ck = tmp_path / "out" / "checkpoint-2"
    manifest = _manifest(ck)
    assert set(manifest) == OLD_MANIFEST_KEYS
    assert (manifest["format"], manifest["version"], manifest["global_step"], manifest["world_size"],
            manifest["save_only_model"]) == ("taskfit-checkpoint", 1, 2, 1, False)
    assert set(manifest["files"]) == OLD_FIT_FILES == {p.name for p in ck.iterdir()} - {"manifest.json"}
    assert set(torch.load(ck / "training_state.pt", weights_only=True)) == NEW_TRAINING_STATE_KEYS
    assert set(json.loads((ck / "config.json").read_text())) == OLD_CONFIG_KEYS
    assert set(torch.load(ck / "rng_state_0.pt", weights_only=True)) == {"numpy", "python", "torch"}
    # HF's decay / no-decay groups (one empty) so transformers.Trainer resumes the folder, as before
    assert len(torch.load(ck / "optimizer.pt", weights_only=True)["param_groups"]) == 2


def test_F_CKPT_2_old_layout_checkpoint_resumes_bitwise(tmp_path):
    torch.manual_seed(0)
    whole = job.Net()
    _fit(tmp_path / "a", 4).fit(whole, job.data())
    ck = tmp_path / "a" / "checkpoint-2"
    assert set(_manifest(ck)["files"]) == OLD_FIT_FILES
    torch.manual_seed(0)
    resumed = job.Net()
    _fit(tmp_path / "b", 4).fit(resumed, job.data(), resume_from_checkpoint=str(ck))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_F_CKPT_1_engine_checkpoint_layout_is_the_old_one_and_loads(tmp_path):
    torch.manual_seed(0)
    engine = Engine(accelerator="cpu", devices=1)
    net = torch.nn.Linear(4, 2)
    model, opt = engine.setup(net, torch.optim.AdamW(net.parameters(), lr=0.1))
    engine.backward(model(torch.randn(3, 4)).sum())
    opt.step()
    folder = tmp_path / "engine"
    engine.save(str(folder), {"model": model, "optimizer": opt, "step": 7, "extra": {"a": 1}})
    manifest = _manifest(folder)
    assert set(manifest) == OLD_MANIFEST_KEYS and manifest["global_step"] == 7
    assert set(manifest["files"]) == OLD_ENGINE_FILES
    ts = torch.load(folder / "training_state.pt", weights_only=True)
    assert set(ts) == OLD_TRAINING_STATE_KEYS - {"loop"} | {"engine"}
    assert ts["engine"] == {"modules": ["model"], "optimizers": ["optimizer"], "schedulers": [],
                            "values": {"step": 7, "extra": {"a": 1}}}
    fresh = torch.nn.Linear(4, 2)
    fmodel, fopt = engine.setup(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1))
    state = {"model": fmodel, "optimizer": fopt, "step": 0, "extra": None}
    engine.load(str(folder), state)
    assert state["step"] == 7 and state["extra"] == {"a": 1}
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), fresh.state_dict().values()))
    assert fopt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
