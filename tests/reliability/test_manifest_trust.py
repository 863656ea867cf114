"""Manifest and rotation trust (F-REL-3): the manifest's schema and the entries a resume needs are validated,
names that leave the checkpoint folder are refused, rotation never follows a link out of ``output_dir``, and garbage
content that matches its manifest entry gives a ``CheckpointError`` naming the file (a corruption matrix over every
file of a single-device checkpoint)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from hostile import edit_manifest, replace_file

from taskfit import Fit
from taskfit.checkpoint.writer import CheckpointError, list_checkpoints, rotate_checkpoints
from taskfit.io import TorchCheckpointIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


def _fit(out: Path, **kw) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, **kw)


@pytest.fixture
def ck(tmp_path) -> Path:
    torch.manual_seed(0)
    _fit(tmp_path / "out", max_steps=4, save_steps=4).fit(job.Net(), job.data())
    return tmp_path / "out" / "checkpoint-4"


def _resume(ck: Path, **kw):
    torch.manual_seed(0)
    return _fit(ck.parent, max_steps=6, **kw).fit(job.Net(), job.data(), resume_from_checkpoint=str(ck))


def test_F_REL_3_rotation_never_follows_a_link_out_of_output_dir(tmp_path):
    outside = tmp_path / "precious"
    (outside / "data").mkdir(parents=True)
    (outside / "data" / "keep.txt").write_text("do not delete")
    (outside / "manifest.json").write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "checkpoint-1")  # looks like the oldest complete checkpoint
    for step in (2, 3, 4):
        (out / f"checkpoint-{step}").mkdir()
        (out / f"checkpoint-{step}" / "manifest.json").write_text("{}")
    io = TorchCheckpointIO()
    assert [s for s, _ in list_checkpoints(io, str(out))] == [2, 3, 4]  # the link is not a checkpoint
    deleted = rotate_checkpoints(io, str(out), 1, keep=set())
    assert [Path(p).name for p in deleted] == ["checkpoint-2", "checkpoint-3"]
    assert (outside / "data" / "keep.txt").read_text() == "do not delete" and (outside / "manifest.json").exists()
    # and a run with save_total_limit over such an output_dir leaves the target alone too
    torch.manual_seed(0)
    _fit(out, max_steps=4, save_steps=1, save_total_limit=1).fit(job.Net(), job.data())
    assert (outside / "data" / "keep.txt").exists() and (outside / "manifest.json").exists()
    assert not os.path.islink(out / "checkpoint-1")  # the save of step 1 replaced the link itself
    assert [s for s, _ in list_checkpoints(io, str(out))] == [4]


@pytest.mark.parametrize("name,why", [("optimizer.pt", "optimizer"), ("scheduler.pt", "LR scheduler"),
                                      ("training_state.pt", "every full checkpoint"),
                                      ("fit_args.json", "every full checkpoint")])
def test_F_REL_3_manifest_missing_a_required_entry_is_refused(ck, name, why):
    edit_manifest(ck, lambda m: m["files"].pop(name))
    with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')}.*not listed.*{why}"):
        _resume(ck)


def test_F_REL_3_manifest_without_weights_is_refused(ck):
    edit_manifest(ck, lambda m: m["files"].pop("model.safetensors"))
    with pytest.raises(CheckpointError, match="no model weights"):
        _resume(ck)


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(files=list(m["files"])), r'"files" must be an object.*got list'),
    (lambda m: m.update(version=99), "format version 99"),
    (lambda m: m.update(format="other"), "not a taskfit checkpoint manifest"),
    (lambda m: m["files"].update({"../escape.pt": {"size": 1, "sha256": "0" * 64}}), r"\.\./escape\.pt.*leaves"),
    (lambda m: m["files"].update({"/etc/passwd": {"size": 1, "sha256": "0" * 64}}), r"/etc/passwd.*leaves"),
    (lambda m: m["files"].update({"shards/../../x": {"size": 1, "sha256": "0" * 64}}), r"leaves"),
    (lambda m: m["files"].update({"model.safetensors": {"size": "12", "sha256": "x"}}), r"model\.safetensors.*must be"),
    (lambda m: m.update(global_step="4"), "'global_step' must be int"),
])
def test_F_REL_3_manifest_schema_is_validated(ck, edit, match):
    edit_manifest(ck, edit)
    with pytest.raises(CheckpointError, match=match):
        _resume(ck)
    with pytest.raises(CheckpointError, match=match):  # also when picked as the newest checkpoint
        torch.manual_seed(0)
        _fit(ck.parent, max_steps=6).fit(job.Net(), job.data(), resume_from_checkpoint=True)


def test_F_REL_3_garbage_manifest_and_a_file_path_name_the_file(ck):
    (ck / "manifest.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(CheckpointError, match=r"manifest\.json.*not valid JSON"):
        _resume(ck)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        _resume(ck / "model.safetensors")


GARBAGE = {"fit_args.json": b"\xff\xfe\x00 not json", "trainer_state.json": b"{",
           "model.safetensors": b"\x00" * 64, "optimizer.pt": b"PK garbage", "scheduler.pt": b"garbage",
           "training_state.pt": b"", "rng_state_0.pt": b"\x80\x04garbage"}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_F_REL_3_garbage_with_a_matching_manifest_entry_names_the_file(ck, name):
    """The corruption matrix: each file of the checkpoint replaced by garbage whose size and SHA-256 the manifest
    records (so the checksum passes): the error is a CheckpointError naming the file."""
    replace_file(ck, name, GARBAGE[name])  # trainer_state.json too: every listed file is checked on resume
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        _resume(ck)


def test_F_REL_3_publishing_refuses_manifest_names_that_leave_the_checkpoint(ck, tmp_path):
    from taskfit.checkpoint.publish import Publisher, push_checkpoint

    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    edit_manifest(ck, lambda m: m["files"].update({"../../secret.txt": {"size": 7, "sha256": "0" * 64}}))

    class FakeFit:  # the two attributes push_checkpoint reads
        args = type("A", (), {"hub_strategy": "checkpoint"})()
        strategy = type("S", (), {"checkpoint_io": TorchCheckpointIO()})()

    pub = Publisher(str(tmp_path / "hub"), retries=0)
    push_checkpoint(FakeFit(), pub, str(ck))
    errors = pub.finish()
    assert errors and "leaves the checkpoint folder" in errors[0]
    assert not list((tmp_path / "hub").rglob("secret.txt"))
