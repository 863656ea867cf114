"""Publishing to a remote fsspec store (F-CKPT-6): hub_strategy uploads, resume from the store, retries, failures
that never break training, manifests written last, model cards, credentials never written."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from taskfit import Callback, Fit, FitArguments
from taskfit.checkpoint.publish import Publisher, hub_storage_options, hub_target

CKPT_TESTS = Path(__file__).parents[1] / "checkpoint"
sys.path.insert(0, str(CKPT_TESTS))
import job  # noqa: E402
from job import assert_same_run  # noqa: E402

TOKEN = "SECRET-TOKEN-1234"
CHECKPOINT_FILES = {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "training_state.pt",
                    "rng_state_0.pt", "trainer_state.json", "fit_args.json", "manifest.json",
                    "rng_state.pth"}  # one process: HF's RNG file too
FINAL_FILES = {"model.safetensors", "config.json", "README.md", "train_results.json", "all_results.json",
               "fit_args.json", "manifest.json"}


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(Publisher, "BACKOFF", 0.01)


def _listing(url: str) -> set[str]:
    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return {p[len(root.rstrip("/")) + 1:] for p in fs.find(root)}


def _run(tmp_path, hub: str, **args) -> dict:
    base = {"max_steps": 8, "push_to_hub": True, "hub_model_id": hub, "hub_always_push": True, "hub_token": TOKEN}
    return job.run({"output_dir": str(tmp_path / "out"), "resume": None, "args": {**base, **args}})


@pytest.mark.parametrize("strategy,expected", [
    ("end", FINAL_FILES),
    ("every_save", FINAL_FILES),
    ("checkpoint", FINAL_FILES | {f"last-checkpoint/{n}" for n in CHECKPOINT_FILES}),
    ("all_checkpoints", FINAL_FILES | {f"checkpoint-{s}/{n}" for s in (4, 8) for n in CHECKPOINT_FILES}),
])
def test_F_CKPT_6_each_hub_strategy_uploads_exactly_the_documented_objects(tmp_path, strategy, expected):
    hub = f"memory://hub-{tmp_path.name}/{strategy}"
    pushed = []

    class Watch(Callback):  # what the store holds right after each save's push had a chance to run
        def on_save(self, args, state, control, **kw):
            pushed.append(state.global_step)

    _run(tmp_path, hub, hub_strategy=strategy)
    assert _listing(hub) == expected
    weights = fsspec.filesystem("memory").cat_file(hub.replace("memory://", "/") + "/model.safetensors")
    local = (tmp_path / "out" / "checkpoint-8" / "model.safetensors").read_bytes()
    assert weights == local  # the final model is the trained one
    manifest = json.loads(fsspec.filesystem("memory").cat_file(hub.replace("memory://", "/") + "/manifest.json"))
    assert set(manifest["files"]) == expected - {"manifest.json"} - {e for e in expected if "/" in e}


def test_F_CKPT_6_every_save_pushes_the_model_at_each_save(tmp_path):
    hub = f"memory://hub-{tmp_path.name}/m"
    seen = {}

    class Peek(Callback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 6:  # after the push of checkpoint-4, before checkpoint-8
                fit._last_fit.publisher.finish()
                seen["files"] = _listing(hub)
                seen["weights"] = fsspec.filesystem("memory").cat_file(hub[len("memory:/"):] + "/model.safetensors")

    fit = job.make_fit({"output_dir": str(tmp_path / "out"), "args": {
        "max_steps": 8, "push_to_hub": True, "hub_model_id": hub, "hub_strategy": "every_save"}})
    fit = Fit(fit.args, callbacks=[Peek()])
    torch.manual_seed(0)
    fit.fit(job.Net(), job.data(), job.data(16, seed=1))
    assert seen["files"] == {"model.safetensors", "config.json", "manifest.json"}
    assert seen["weights"] == (tmp_path / "out" / "checkpoint-4" / "model.safetensors").read_bytes()


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_F_CKPT_6_resume_from_last_checkpoint_in_s3_continues_exactly(tmp_path, s3_bucket):
    cfg = {"save_steps": 4, "args": {"max_steps": 12}}
    ref = job.run({**cfg, "output_dir": str(tmp_path / "ref"), "resume": None})
    hub = f"{s3_bucket}/models/net"
    first = job.make_fit({**cfg, "output_dir": str(tmp_path / "first"), "args": {
        "max_steps": 12, "push_to_hub": True, "hub_model_id": hub, "hub_strategy": "checkpoint",
        "hub_always_push": True}})
    first = Fit(first.args, callbacks=[StopAt(9)])  # stops after step 9: the last pushed checkpoint is step 8
    torch.manual_seed(0)
    first.fit(job.Net(), job.data(), job.data(16, seed=1))
    assert json.loads(fsspec.open(f"{hub}/last-checkpoint/manifest.json").open().read())["global_step"] == 8
    resumed = job.run({**cfg, "output_dir": str(tmp_path / "second"), "resume": f"{hub}/last-checkpoint"})
    assert_same_run(ref, resumed)


class FlakyFS(MemoryFileSystem):
    """A memory store whose writes fail ``fail_times`` times (then succeed, or fail forever with -1)."""

    protocol = "flaky"
    fail_times = 0
    calls = 0

    def pipe_file(self, path, value, **kwargs):
        FlakyFS.calls += 1
        if FlakyFS.fail_times < 0 or FlakyFS.calls <= FlakyFS.fail_times:
            raise ConnectionError(f"injected failure #{FlakyFS.calls}")
        return super().pipe_file(path, value, **kwargs)


@pytest.fixture
def flaky():
    fsspec.register_implementation("flaky", FlakyFS, clobber=True)
    FlakyFS.calls = 0
    yield FlakyFS
    FlakyFS.fail_times = 0


def test_F_CKPT_6_push_failing_twice_is_retried_and_the_run_ends_green(tmp_path, flaky, caplog):
    flaky.fail_times = 2
    hub = f"flaky://hub-{tmp_path.name}/retry"
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        out = _run(tmp_path, hub, hub_strategy="end")
    assert out["global_step"] == 8
    assert caplog.text.count("retrying in") == 2 and "failed after" not in caplog.text
    assert _listing(hub) == FINAL_FILES


def test_F_CKPT_6_push_that_always_fails_is_reported_and_training_is_intact(tmp_path, flaky, caplog):
    flaky.fail_times = -1
    hub = f"flaky://hub-{tmp_path.name}/down"
    fit = job.make_fit({"output_dir": str(tmp_path / "out"), "args": {
        "max_steps": 8, "push_to_hub": True, "hub_model_id": hub, "hub_strategy": "checkpoint",
        "hub_always_push": True}})
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        result = fit.fit(job.Net(), job.data(), job.data(16, seed=1))
    assert fit.state.global_step == 8 and result.metrics["push_errors"] == 3  # checkpoints 4 and 8, final model
    assert len(fit._last_fit.publisher.errors) == 3 and "injected failure" in fit._last_fit.publisher.errors[0]
    assert "had 3 failed push(es)" in caplog.text
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-4", "checkpoint-8"]  # local checkpoints intact
    assert (tmp_path / "out" / "checkpoint-8" / "manifest.json").exists()


def test_F_CKPT_6_interrupted_upload_never_looks_complete(tmp_path, flaky):
    hub = f"flaky://hub-{tmp_path.name}/partial"
    good = Publisher(hub, retries=0)
    good.upload_files("", {"a.json": {"v": 1}, "b.json": {"v": 2}})  # a complete earlier upload
    assert _listing(hub) == {"a.json", "b.json", "manifest.json"}
    flaky.calls, flaky.fail_times = 0, 0

    class FailSecond(FlakyFS):
        def pipe_file(self, path, value, **kwargs):
            if path.endswith("b.json"):
                raise ConnectionError("connection reset")
            return super().pipe_file(path, value, **kwargs)

    fsspec.register_implementation("flaky", FailSecond, clobber=True)
    bad = Publisher(hub, retries=0)
    bad.submit("new model", lambda: bad.upload_files("", {"a.json": {"v": 10}, "b.json": {"v": 20}}))
    assert len(bad.finish()) == 1
    assert "manifest.json" not in _listing(hub)  # the old manifest went first, the new one never came


class SlowFS(MemoryFileSystem):
    protocol = "slowmem"
    active = 0
    max_active = 0
    lock = threading.Lock()

    def pipe_file(self, path, value, **kwargs):
        with SlowFS.lock:
            SlowFS.active += 1
            SlowFS.max_active = max(SlowFS.max_active, SlowFS.active)
        time.sleep(0.05)
        with SlowFS.lock:
            SlowFS.active -= 1
        return super().pipe_file(path, value, **kwargs)


@pytest.mark.parametrize("always", [False, True])
def test_F_CKPT_6_hub_always_push_skips_or_queues_never_two_at_once(tmp_path, always):
    fsspec.register_implementation("slowmem", SlowFS, clobber=True)
    SlowFS.max_active = 0
    hub = f"slowmem://hub-{tmp_path.name}/{always}"
    fit = job.make_fit({"output_dir": str(tmp_path / "out"), "save_steps": 1, "args": {
        "max_steps": 6, "push_to_hub": True, "hub_model_id": hub, "hub_strategy": "all_checkpoints",
        "hub_always_push": always}})
    torch.manual_seed(0)
    fit.fit(job.Net(), job.data(), job.data(16, seed=1))
    pub = fit._last_fit.publisher
    pushed = sorted(int(p.split("-")[1]) for p in pub.pushed if p.startswith("checkpoint-"))
    folders = sorted(int(p.split("/")[0].split("-")[1]) for p in _listing(hub) if p.startswith("checkpoint-")
                     and p.endswith("manifest.json"))
    assert SlowFS.max_active == 1 and folders == pushed
    if always:
        assert pushed == [1, 2, 3, 4, 5, 6] and pub.skipped == 0
    else:
        assert pub.skipped > 0 and len(pushed) == 6 - pub.skipped and pushed[0] == 1


def test_F_CKPT_6_model_card_and_no_credentials_anywhere(tmp_path):
    hub = f"memory://hub-{tmp_path.name}/card"
    _run(tmp_path, hub, hub_strategy="checkpoint", report_to="csv", eval_strategy="steps", eval_steps=4)
    card = fsspec.filesystem("memory").cat_file(hub[len("memory:/"):] + "/README.md").decode()
    for text in ("`Net` with 161 parameters", "| optimizer | adamw_torch_fused |", "| learning_rate | 0.05 |",
                 "| precision | 32-true |", "| strategy | single_device |", "| per_device_train_batch_size | 4 |",
                 "| gradient_accumulation_steps | 2 |", "| max_steps / steps done | 8 / 8 |", "train_loss",
                 "| val_mse |", "taskfit 0.1.0"):
        assert text in card, text
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    written += [p for p in Path("runs").rglob("*") if p.is_file()] if Path("runs").exists() else []
    for p in written:
        assert TOKEN.encode() not in p.read_bytes(), p
    fs = fsspec.filesystem("memory")
    for p in fs.find(hub[len("memory:/"):]):
        assert TOKEN.encode() not in fs.cat_file(p), p


def test_F_CKPT_6_create_model_card_names_datasets_and_best_metric(tmp_path):
    fit = job.make_fit({"output_dir": str(tmp_path / "out"), "args": {
        "max_steps": 8, "eval_steps": 4, "save_steps": 4, "metric_for_best_model": "val_mse"}})
    torch.manual_seed(0)
    fit.fit(job.Net(), job.data(), job.data(16, seed=1))
    card = fit.create_model_card(dataset=["synthetic-regression"], finetuned_from="scratch")
    assert (tmp_path / "out" / "README.md").read_text() == card
    assert 'datasets: ["synthetic-regression"]' in card and "- synthetic-regression" in card
    assert f"best val_mse | {fit.state.best_metric} (global_step {fit.state.best_global_step})" in card


def test_F_CKPT_6_target_resolution_and_storage_options(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKFIT_HUB_ROOT", str(tmp_path / "hubroot"))
    assert hub_target(FitArguments(hub_model_id="org/name")) == str(tmp_path / "hubroot" / "org" / "name")
    assert hub_target(FitArguments(output_dir="runs/exp1")) == str(tmp_path / "hubroot" / "exp1")
    assert hub_target(FitArguments(hub_model_id="s3://b/models/x/")) == "s3://b/models/x"
    a = FitArguments(hub_model_id="s3://b/m", hub_token="t0k", hub_private_repo=True)
    assert hub_storage_options(a, hub_target(a)) == {"token": "t0k", "s3_additional_kwargs": {"ACL": "private"}}
    assert hub_storage_options(FitArguments(hub_private_repo=True), "memory://x") == {}
    # a bare name publishes under the root
    _run(tmp_path, "team/net", hub_strategy="end", hub_token=None)
    assert set(os.listdir(tmp_path / "hubroot" / "team" / "net")) == FINAL_FILES
