"""F-REL-3: a hostile ``manifest.json`` is refused with a ``CheckpointError`` naming the file, never a raw Python
error: deeply nested JSON (a ``RecursionError`` in ``json.loads`` before), nesting deeper than any manifest has,
an oversized file, ``NaN``/``Infinity`` constants, a top level that is not an object. Unit cases read the manifest
through :func:`read_manifest`; one case resumes a real run from a checkpoint whose manifest was replaced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from taskfit import Fit
from taskfit.io import TorchCheckpointIO, checkpoint_format
from taskfit.io.checkpoint_format import read_manifest
from taskfit.io.checkpoint_io import CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job

MANIFEST_MAX_BYTES = getattr(checkpoint_format, "MANIFEST_MAX_BYTES", 16 << 20)

DEEP = b'{"files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
HOSTILE = {
    "deeply_nested": (DEEP, "nested"),
    "nested_past_the_schema": (b'{"format": "taskfit-checkpoint", "version": 1, "files": {}, "x": '
                               + b"[" * 50 + b"]" * 50 + b"}", "nested"),
    "nan": (b'{"format": "taskfit-checkpoint", "version": 1, "global_step": NaN, "files": {}}', "not valid JSON"),
    "infinity": (b'{"format": "taskfit-checkpoint", "version": 1, "global_step": -Infinity, "files": {}}',
                 "not valid JSON"),
    "top_level_list": (b"[1, 2, 3]", "not a taskfit checkpoint manifest"),
    "top_level_string": (b'"manifest"', "not a taskfit checkpoint manifest"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_F_REL_3_hostile_manifest_json_is_refused_naming_the_file(name, tmp_path):
    data, match = HOSTILE[name]
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(data)
    with pytest.raises(CheckpointError, match=match) as err:
        read_manifest(TorchCheckpointIO(), str(folder))
    assert str(folder / "manifest.json") in str(err.value)


def test_F_REL_3_oversized_manifest_is_refused_before_parsing(tmp_path):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(b'{"pad": "' + b"x" * MANIFEST_MAX_BYTES + b'"}')
    with pytest.raises(CheckpointError, match=r"manifest\.json.*bytes.*larger than") as err:
        read_manifest(TorchCheckpointIO(), str(folder))
    assert str(folder / "manifest.json") in str(err.value)


def test_F_REL_3_resume_from_a_deeply_nested_manifest_raises_checkpoint_error(tmp_path):
    def fit(**kw):
        return Fit(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, report_to="none",
                   disable_tqdm=True, **kw)

    torch.manual_seed(0)
    fit(max_steps=2, save_steps=2).fit(job.Net(), job.data())
    ck = tmp_path / "out" / "checkpoint-2"
    (ck / "manifest.json").write_bytes(DEEP)
    with pytest.raises(CheckpointError, match=r"manifest\.json.*nested"):
        fit(max_steps=4).fit(job.Net(), job.data(), resume_from_checkpoint=str(ck))
