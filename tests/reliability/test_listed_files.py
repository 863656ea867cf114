"""Every file a checkpoint's manifest lists is verified when the checkpoint is resumed (issue 30, F-REL-4,
F-CKPT-4), also the files a taskfit resume does not need: ``rng_state.pth`` (HF's RNG file, for transformers
interop), ``trainer_state.json`` and ``config.json``. Each is tampered with in five ways (truncated, one bit
flipped, deleted, replaced by a pickle, its manifest hash changed) and a sixth (replaced by a hostile pickle with
a matching manifest entry); a resume refuses every one with an error naming the file, and no code runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hostile import edit_manifest, evil_pickle, replace_file

from taskfit import Fit
from taskfit.io import CheckpointError, UnsafeCheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


def _fit(out: Path, **kw) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, **kw)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "out"
    torch.manual_seed(0)
    _fit(out, max_steps=4, save_steps=4).fit(job.Net(), job.data())
    return out / "checkpoint-4"


def _copy(pristine: Path, tmp_path: Path) -> Path:
    import shutil

    ck = tmp_path / "out" / "checkpoint-4"
    shutil.copytree(pristine, ck)
    return ck


def _resume(ck: Path):
    torch.manual_seed(0)
    return _fit(ck.parent, max_steps=6, save_strategy="no").fit(job.Net(), job.data(),
                                                               resume_from_checkpoint=str(ck))


def _truncate(ck, name, marker):
    (ck / name).write_bytes((ck / name).read_bytes()[:-7])


def _flip(ck, name, marker):
    data = bytearray((ck / name).read_bytes())
    data[len(data) // 2] ^= 0x10
    (ck / name).write_bytes(bytes(data))


def _delete(ck, name, marker):
    (ck / name).unlink()


def _pickle(ck, name, marker):
    (ck / name).write_bytes(evil_pickle(marker))


def _rehash(ck, name, marker):
    edit_manifest(ck, lambda m: m["files"][name].update(sha256="0" * 64))


KINDS = {"truncated": (_truncate, "truncated"), "bit-flipped": (_flip, "corrupted"), "deleted": (_delete, "missing"),
         "pickle": (_pickle, "truncated|corrupted"), "hash-tampered": (_rehash, "corrupted")}
NAMES = ["rng_state.pth", "trainer_state.json", "config.json"]


def test_F_REL_4_the_unneeded_files_are_listed(pristine):
    """The files below are in the manifest and a taskfit resume needs none of them."""
    assert set(NAMES) <= set(json.loads((pristine / "manifest.json").read_text())["files"])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", NAMES)
def test_F_REL_4_every_listed_file_is_verified_on_resume(name, kind, pristine, tmp_path):
    ck, marker = _copy(pristine, tmp_path), tmp_path / "pwned"
    tamper, what = KINDS[kind]
    tamper(ck, name, marker)
    with pytest.raises(CheckpointError, match=rf"{name.replace('.', '[.]')}'? is ({what})"):
        _resume(ck)
    assert not marker.exists()


@pytest.mark.parametrize("name", NAMES)
def test_F_REL_4_a_hostile_file_with_a_matching_entry_is_refused(name, pristine, tmp_path):
    """The manifest rewritten to match a hostile pickle: the hash holds, the content check refuses it."""
    ck, marker = _copy(pristine, tmp_path), tmp_path / "pwned"
    replace_file(ck, name, evil_pickle(marker))
    with pytest.raises(CheckpointError, match=name.replace(".", "[.]")) as info:
        _resume(ck)
    if name.endswith(".pth"):
        assert isinstance(info.value, UnsafeCheckpointError)
    assert not marker.exists()


def test_F_REL_4_an_untouched_checkpoint_resumes(pristine, tmp_path):
    assert _resume(_copy(pristine, tmp_path)).global_step == 6
