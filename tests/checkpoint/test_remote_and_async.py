"""Remote output folders over fsspec (``file://``, ``memory://``, S3 served by moto on 127.0.0.1) and background
checkpoint saving (F-CKPT-4, F-EVAL-5)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import fsspec
import pytest
import torch

from taskfit import Callback, Fit
from taskfit.checkpoint.writer import list_checkpoints
from taskfit.io import AsyncCheckpointIO, CheckpointSaveError, TorchCheckpointIO

sys.path.insert(0, str(Path(__file__).parent))
import job  # noqa: E402
from job import assert_same_run  # noqa: E402


def _cfg(out: str, **kw) -> dict:
    return {"output_dir": out, "save_steps": 4, "args": {"max_steps": 12}, **kw}


def _resume_matches(out: str, ref: dict, plugin=None) -> None:
    """Drop the checkpoints after step 8 and resume: the result equals the uninterrupted run."""
    io = TorchCheckpointIO()
    for step, path in list_checkpoints(io, out):
        if step > 8:
            io.remove_checkpoint(path)
    assert [s for s, _ in list_checkpoints(io, out)] == [4, 8]
    assert_same_run(ref, job.run(_cfg(out, resume=True)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return job.run(_cfg(str(tmp_path_factory.mktemp("ref") / "out"), resume=None))


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_F_CKPT_4_fsspec_output_dir_saves_and_resumes_exactly(scheme, tmp_path, reference):
    out = f"file://{tmp_path}/out" if scheme == "file" else f"memory://taskfit-{tmp_path.name}/out"
    assert_same_run(reference, job.run(_cfg(out, resume=None)))
    fs, inner = fsspec.core.url_to_fs(out)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(inner, detail=False))
    assert names == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]
    manifest = json.loads(fs.cat_file(f"{inner}/checkpoint-8/manifest.json"))
    assert "optimizer.pt" in manifest["files"] and manifest["global_step"] == 8
    _resume_matches(out, reference)


def test_F_CKPT_4_s3_output_dir_saves_rotates_and_resumes_exactly(s3_bucket, reference):
    import s3fs

    out = f"{s3_bucket}/run"
    assert_same_run(reference, job.run(_cfg(out, resume=None)))
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(out)) == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]
    _resume_matches(out, reference)
    rotated = f"{s3_bucket}/rotated"
    job.run(_cfg(rotated, resume=None, args={"max_steps": 12, "save_total_limit": 2}))
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(rotated)) == ["checkpoint-12", "checkpoint-8"]


def test_F_EVAL_5_save_model_state_and_metrics_to_a_url(tmp_path):
    out = f"memory://taskfit-{tmp_path.name}/final"
    fit = Fit(output_dir=out, max_steps=2, save_strategy="no", report_to="none", disable_tqdm=True,
              per_device_train_batch_size=4)
    torch.manual_seed(0)
    module = job.Net()
    result = fit.fit(module, job.data())
    fit.save_model()
    fit.save_state()
    fit.save_metrics("train", result.metrics)
    fit.save_metrics("eval", {"eval_loss": 0.5})
    fs, inner = fsspec.core.url_to_fs(out)
    weights = TorchCheckpointIO().load_weights(f"{out}/model.safetensors")
    assert torch.equal(weights["body.0.weight"], module.body[0].weight)
    assert json.loads(fs.cat_file(f"{inner}/trainer_state.json"))["global_step"] == 2
    assert json.loads(fs.cat_file(f"{inner}/fit_args.json"))["max_steps"] == 2
    merged = json.loads(fs.cat_file(f"{inner}/all_results.json"))
    assert merged["eval_loss"] == 0.5 and merged["train_loss"] == pytest.approx(result.training_loss)


# ---- background saving ------------------------------------------------------------------------------------
class GatedIO(TorchCheckpointIO):
    """Each save waits until the training loop has taken another optimizer step: possible only when the save runs
    in the background. Records how many saves run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.step_taken = threading.Event()
        self.running = 0
        self.max_running = 0
        self.steps_during_save: list[int] = []
        self.fit = None

    def save_files(self, files, folder, finalize=None):
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.step_taken.clear()
        start = self.fit.state.global_step
        if start >= self.fit.state.max_steps:  # the final save: no step follows it
            self.steps_during_save.append(0)
        elif not self.step_taken.wait(timeout=20):
            self.running -= 1
            raise TimeoutError("training did not advance while the checkpoint was being written")
        else:
            self.steps_during_save.append(self.fit.state.global_step - start)
        super().save_files(files, folder, finalize)
        self.running -= 1


class Signal(Callback):
    def __init__(self, io: GatedIO) -> None:
        self.io = io

    def on_step_end(self, args, state, control, **kw):
        self.io.step_taken.set()


def test_F_CKPT_4_async_saves_in_background_one_at_a_time_same_bytes(tmp_path, reference):
    gated = GatedIO()
    fit = job.make_fit(_cfg(str(tmp_path / "async"), args={"max_steps": 11}))
    fit = Fit(fit.args, plugins=[AsyncCheckpointIO(gated)], callbacks=[Signal(gated)])
    gated.fit = fit
    torch.manual_seed(0)
    fit.fit(job.Net(), job.data(), job.data(16, seed=1))
    assert gated.max_running == 1 and len(gated.steps_during_save) == 3  # steps 4 and 8 and the final 11
    assert all(n >= 1 for n in gated.steps_during_save[:2])  # training advanced while steps 4 and 8 were saved
    # a synchronous run writes byte-identical checkpoints
    sync = job.run(_cfg(str(tmp_path / "sync"), resume=None, args={"max_steps": 11}))
    for step in (4, 8, 11):
        a_dir, b_dir = tmp_path / "async" / f"checkpoint-{step}", tmp_path / "sync" / f"checkpoint-{step}"
        a = json.loads((a_dir / "manifest.json").read_text())["files"]
        b = json.loads((b_dir / "manifest.json").read_text())["files"]
        assert a.keys() == b.keys()
        assert a["model.safetensors"] == b["model.safetensors"]  # safetensors bytes are deterministic
        for name in a:  # torch.save embeds a random serialization id, so compare the loaded contents
            if name.endswith(".pt"):
                got, want = torch.load(a_dir / name, weights_only=True), torch.load(b_dir / name, weights_only=True)
                if name == "training_state.pt":
                    assert got.pop("callbacks") == {"Signal": {}} and want.pop("callbacks") == {}
                _assert_equal(got, want)
    assert sync["global_step"] == 11


def test_F_CKPT_4_async_checkpoint_io_by_name_resumes_exactly(tmp_path, reference):
    out = str(tmp_path / "out")
    ran = job.run(_cfg(out, resume=None, args={"max_steps": 12, "checkpoint_io": "async"}))
    assert_same_run(reference, ran)
    _resume_matches(out, reference)


def _assert_equal(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            if k not in job.SPEED_KEYS:  # wall-clock timings differ between any two runs
                _assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b or (a != a and b != b), (a, b)  # NaN == NaN here


class FailingIO(TorchCheckpointIO):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def save_files(self, files, folder, finalize=None):
        if folder.rstrip("/").endswith((f"checkpoint-{self.fail_at}", f"checkpoint-{self.fail_at}.tmp")):
            raise OSError("disk full (injected)")
        super().save_files(files, folder, finalize)


@pytest.mark.parametrize("fail_at,raised_at", [(4, "the next save"), (12, "the end")])
def test_F_CKPT_4_failed_background_save_is_raised_not_swallowed(tmp_path, fail_at, raised_at):
    steps = []

    class Track(Callback):
        def on_step_end(self, args, state, control, **kw):
            steps.append(state.global_step)

    fit = Fit(output_dir=str(tmp_path / "out"), max_steps=12, save_steps=4, per_device_train_batch_size=4,
              report_to="none", disable_tqdm=True, plugins=[AsyncCheckpointIO(FailingIO(fail_at))],
              callbacks=[Track()])
    torch.manual_seed(0)
    with pytest.raises(CheckpointSaveError, match="disk full"):
        fit.fit(job.Net(), job.data())
    # raised at the save of step 8 (the next one) or after the last step
    assert steps[-1] == (8 if fail_at == 4 else 12)
