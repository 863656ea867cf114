"""Checkpoint contents, integrity, safety, save strategies, rotation and the best model (F-CKPT-1, F-CKPT-2,
F-CKPT-3, F-CKPT-4, F-LOOP-6)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from taskfit import Callback, EarlyStopping, Fit, FitArguments
from taskfit.checkpoint.writer import CheckpointError, is_writer, list_checkpoints, rotate_checkpoints
from taskfit.io import TorchCheckpointIO, UnsafeCheckpointError

sys.path.insert(0, str(Path(__file__).parent))
import job


def _fit(tmp_path, **kw) -> Fit:
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                learning_rate=0.05, report_to="none", disable_tqdm=True, seed=3)
    return Fit(**{**base, **kw})


def _net() -> job.Net:
    torch.manual_seed(0)
    return job.Net()


def test_F_CKPT_1_layout_and_manifest_checksums(tmp_path):
    fit = _fit(tmp_path, max_steps=4, save_steps=2)
    fit.fit(_net(), job.data())
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4"]
    ck = out / "checkpoint-4"
    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["global_step"] == 4 and manifest["world_size"] == 1 and manifest["format"] == "taskfit-checkpoint"
    on_disk = {p.name for p in ck.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk == {
        "model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "training_state.pt", "rng_state_0.pt",
        "trainer_state.json", "fit_args.json",
        "rng_state.pth"}  # one process: HF's RNG file too, so transformers.Trainer resumes from the folder
    for name, entry in manifest["files"].items():
        data = (ck / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    ts = torch.load(ck / "training_state.pt", weights_only=True)
    assert {"precision", "state", "control", "callbacks", "loop", "results"} <= set(ts)
    assert ts["state"]["global_step"] == 4 and ts["state"]["batch_in_epoch"] == 4
    assert {"python", "numpy", "torch"} <= set(torch.load(ck / "rng_state_0.pt", weights_only=True))
    assert json.loads((ck / "trainer_state.json").read_text())["global_step"] == 4
    assert json.loads((ck / "fit_args.json").read_text())["save_steps"] == 2


def test_F_CKPT_1_save_safetensors_false_writes_pytorch_model_bin(tmp_path):
    fit = _fit(tmp_path, max_steps=2, save_steps=2, save_safetensors=False)
    module = _net()
    fit.fit(module, job.data())
    ck = tmp_path / "out" / "checkpoint-2"
    assert (ck / "pytorch_model.bin").exists() and not (ck / "model.safetensors").exists()
    back = torch.load(ck / "pytorch_model.bin", weights_only=True)
    assert torch.equal(back["body.0.weight"], module.body[0].weight)


def test_F_CKPT_1_save_only_model_writes_weights_only_and_refuses_resume(tmp_path):
    fit = _fit(tmp_path, max_steps=2, save_steps=2, save_only_model=True)
    fit.fit(_net(), job.data())
    ck = tmp_path / "out" / "checkpoint-2"
    assert {p.name for p in ck.iterdir()} == {"model.safetensors", "config.json", "rng_state_0.pt",
                                               "trainer_state.json", "fit_args.json", "manifest.json"}
    with pytest.raises(CheckpointError, match="save_only_model=True"):
        _fit(tmp_path, max_steps=4, save_steps=2).fit(_net(), job.data(), resume_from_checkpoint=str(ck))


def test_F_CKPT_1_save_strategies_no_epoch_best(tmp_path):
    fit = _fit(tmp_path / "no", max_steps=4, save_strategy="no")
    fit.fit(_net(), job.data())
    assert not (tmp_path / "no" / "out").exists()

    fit = _fit(tmp_path / "epoch", num_train_epochs=2, save_strategy="epoch")  # 13 batches per epoch
    fit.fit(_net(), job.data())
    assert sorted(os.listdir(tmp_path / "epoch" / "out")) == ["checkpoint-13", "checkpoint-26"]

    scores = iter([3.0, 1.0, 2.0, 0.5])
    fit = _fit(tmp_path / "best", max_steps=8, eval_strategy="steps", eval_steps=2, save_strategy="best",
               metric_for_best_model="score", greater_is_better=False)
    fit.fit(Scripted(scores), job.data(), job.data(8, seed=1))
    # new best at steps 2 (3.0), 4 (1.0) and 8 (0.5); step 6 (2.0) is worse than 1.0
    assert sorted(os.listdir(tmp_path / "best" / "out"), key=lambda n: int(n.split("-")[1])) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-8"]


class Scripted(job.Net):
    """Reports the next value of ``scores`` as ``score`` at each evaluation."""

    def __init__(self, scores) -> None:
        torch.manual_seed(0)
        super().__init__()
        self.scores = scores
        self.current = None

    def on_validation_epoch_start(self):
        self.current = next(self.scores)

    def validation_step(self, batch, batch_idx):
        self.log("score", torch.tensor(self.current))


def test_F_CKPT_3_rotation_keeps_best_and_newest_and_load_best_model_at_end(tmp_path, caplog):
    scores = iter([0.9, 0.2, 0.6, 0.7, 0.8, 0.95])  # best (lowest) at step 4
    fit = _fit(tmp_path, max_steps=12, eval_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=2,
               load_best_model_at_end=True, metric_for_best_model="score", greater_is_better=False)
    module = Scripted(scores)
    with caplog.at_level(logging.INFO, logger="taskfit"):
        out = fit.fit(module, job.data(), job.data(8, seed=1))
    out_dir = tmp_path / "out"
    assert sorted(os.listdir(out_dir)) == ["checkpoint-12", "checkpoint-4"]  # the best and the newest survive
    assert out.metrics["best_global_step"] == 4 and out.metrics["best_metric"] == pytest.approx(0.2)
    assert out.metrics["best_model_checkpoint"] == str(out_dir / "checkpoint-4")
    best = TorchCheckpointIO().load_weights(str(out_dir / "checkpoint-4" / "model.safetensors"))
    last = TorchCheckpointIO().load_weights(str(out_dir / "checkpoint-12" / "model.safetensors"))
    for k, v in module.state_dict().items():
        assert torch.equal(v, best[k]), k
    assert not torch.equal(best["body.0.weight"], last["body.0.weight"])
    assert "Loaded the best model from" in caplog.text and "global_step 4" in caplog.text


def test_F_CKPT_3_rotation_without_best_keeps_the_newest(tmp_path):
    io = TorchCheckpointIO()
    for step in (2, 4, 6, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "manifest.json").write_text("{}")
    (tmp_path / "checkpoint-10").mkdir()  # incomplete: not counted, not deleted
    deleted = rotate_checkpoints(io, str(tmp_path), 2, keep={str(tmp_path / "checkpoint-8")})
    assert [Path(p).name for p in deleted] == ["checkpoint-2", "checkpoint-4"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]
    assert [s for s, _ in list_checkpoints(io, str(tmp_path))] == [6, 8]


def _checkpoint(tmp_path, **kw) -> Path:
    _fit(tmp_path, max_steps=4, save_steps=4, **kw).fit(_net(), job.data())
    return tmp_path / "out" / "checkpoint-4"


@pytest.fixture(scope="module")
def clean_checkpoint(tmp_path_factory) -> Path:
    """One intact ``checkpoint-4`` (``_checkpoint``'s run), trained once for the file; tests damage copies of it."""
    return _checkpoint(tmp_path_factory.mktemp("clean"))


def _copy_of(clean: Path, tmp_path) -> Path:
    """A fresh copy of ``clean`` as ``tmp_path/out/checkpoint-4``, replacing what a previous copy left there."""
    ck = tmp_path / "out" / "checkpoint-4"
    shutil.rmtree(ck, ignore_errors=True)
    shutil.copytree(clean, ck)
    return ck


def test_F_CKPT_4_corrupted_or_truncated_file_names_the_file(tmp_path, clean_checkpoint):
    ck = _copy_of(clean_checkpoint, tmp_path)
    opt = ck / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    opt.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer\.pt.* is corrupted"):
        _fit(tmp_path, max_steps=6).fit(_net(), job.data(), resume_from_checkpoint=str(ck))
    ck = _copy_of(clean_checkpoint, tmp_path)
    weights = ck / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.* is truncated"):
        _fit(tmp_path, max_steps=6).fit(_net(), job.data(), resume_from_checkpoint="last")
    ck = _copy_of(clean_checkpoint, tmp_path)
    (ck / "scheduler.pt").unlink()
    with pytest.raises(CheckpointError, match=r"scheduler\.pt.* is missing"):
        _fit(tmp_path, max_steps=6).fit(_net(), job.data(), resume_from_checkpoint=True)


class Opaque:
    """A plain Python object: torch.load(weights_only=True) refuses to unpickle it."""

    def __init__(self, value: int) -> None:
        self.value = value


class OpaqueState(Callback):
    def __init__(self) -> None:
        self.thing = Opaque(1)

    def state_dict(self):
        return {"thing": self.thing}

    def load_state_dict(self, state):
        self.thing = state["thing"]


def test_F_CKPT_4_unsafe_pickle_refused_unless_weights_only_false(tmp_path):
    ck = _checkpoint(tmp_path, callbacks=[OpaqueState()])
    with pytest.raises(UnsafeCheckpointError, match=r"training_state\.pt.*weights_only=False"):
        _fit(tmp_path, max_steps=6).fit(_net(), job.data(), resume_from_checkpoint=str(ck))
    cb = OpaqueState()
    cb.thing = Opaque(0)
    fit = _fit(tmp_path, max_steps=6, callbacks=[cb])
    fit.fit(_net(), job.data(), resume_from_checkpoint=str(ck), weights_only=False)
    assert cb.thing.value == 1 and fit.state.global_step == 6


def test_F_CKPT_2_resume_true_last_and_path_and_fresh_start(tmp_path, caplog):
    _fit(tmp_path, max_steps=6, save_steps=2).fit(_net(), job.data())
    out = tmp_path / "out"
    (out / "checkpoint-8.tmp").mkdir()  # an interrupted local save
    (out / "checkpoint-10").mkdir()  # an object-store style partial save: files but no manifest
    (out / "checkpoint-10" / "model.safetensors").write_bytes(b"partial")
    seen = {}

    class Start(Callback):
        def on_train_begin(self, args, state, control, **kw):
            seen.setdefault("steps", []).append(state.global_step)

    for value in (True, "last", str(out / "checkpoint-4")):
        with caplog.at_level(logging.WARNING, logger="taskfit"):
            _fit(tmp_path, max_steps=8, save_strategy="no", callbacks=[Start()]).fit(
                _net(), job.data(), resume_from_checkpoint=value)
    assert seen["steps"] == [6, 6, 4]
    assert "Ignoring incomplete checkpoints" in caplog.text and "checkpoint-10" in caplog.text
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        _fit(tmp_path, max_steps=8).fit(_net(), job.data(), resume_from_checkpoint=str(out / "checkpoint-10"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        fit = _fit(tmp_path / "empty", max_steps=2, save_strategy="no")
        fit.fit(_net(), job.data(), resume_from_checkpoint=True)
    assert fit.state.global_step == 2 and "training from scratch" in caplog.text
    # the FitArguments option works as the fit() argument does
    fit = _fit(tmp_path, max_steps=8, save_strategy="no", resume_from_checkpoint=str(out / "checkpoint-2"),
               callbacks=[Start()])
    fit.fit(_net(), job.data())
    assert seen["steps"][-1] == 2


class Recording(torch.utils.data.Dataset):
    """Records every index that is loaded."""

    def __init__(self, n: int) -> None:
        self.base = job.data(n)
        self.loaded: list[int] = []

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        self.loaded.append(i)
        return self.base[i]


def test_F_CKPT_2_mid_epoch_resume_loads_only_unseen_samples(tmp_path):
    ref_data = Recording(40)
    _fit(tmp_path, max_steps=6, save_steps=3).fit(_net(), ref_data)  # 10 batches per epoch
    epoch0 = ref_data.loaded[:40]
    data = Recording(40)
    _fit(tmp_path, max_steps=6, save_strategy="no").fit(_net(), data,
                                                         resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    assert data.loaded == epoch0[12:24]  # batches 4..6 of the same shuffled order; batches 1..3 never loaded


def test_F_CKPT_2_changed_batch_size_mid_epoch_continues_as_hf_and_ignore_data_skip(tmp_path, caplog):
    """F-CKPT-2: a mid-epoch checkpoint resumed with another batch size continues by transformers' rule
    (global_step x accumulation batches of the new loader skipped) with a warning naming the change;
    ``ignore_data_skip=True`` restarts the epoch; an accumulation change keeps the position, with a warning."""
    _fit(tmp_path, max_steps=3, save_steps=3).fit(_net(), job.data())
    ck = str(tmp_path / "out" / "checkpoint-3")
    batches = []

    class Count(Callback):
        def on_train_batch_start(self, fit, module, batch, batch_idx):
            batches.append(batch_idx)

    with caplog.at_level(logging.WARNING, logger="taskfit"):
        _fit(tmp_path, max_steps=6, per_device_train_batch_size=8, save_strategy="no", callbacks=[Count()]).fit(
            _net(), job.data(), resume_from_checkpoint=ck)
    assert batches == [3, 4, 5]  # 3 steps x 1 micro-batch skipped in the new 7-batch epoch, as HF
    assert "per_device_train_batch_size 4 -> 8" in caplog.text and "ignore_data_skip=True" in caplog.text
    batches.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        _fit(tmp_path, max_steps=5, per_device_train_batch_size=8, ignore_data_skip=True, save_strategy="no",
             callbacks=[Count()]).fit(_net(), job.data(), resume_from_checkpoint=ck)
    assert batches == [0, 1]  # the epoch restarts from its first batch
    assert "per_device_train_batch_size 4 -> 8" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        _fit(tmp_path, max_steps=4, gradient_accumulation_steps=2, save_strategy="no").fit(
            _net(), job.data(), resume_from_checkpoint=ck)
    assert "gradient_accumulation_steps 1 -> 2" in caplog.text


def test_F_LOOP_6_callback_states_restored_on_resume(tmp_path):
    es = EarlyStopping(monitor="val_mse", patience=50)
    _fit(tmp_path, max_steps=6, eval_strategy="steps", eval_steps=2, save_steps=6, callbacks=[es]).fit(
        _net(), job.data(), job.data(8, seed=1))
    saved = es.state_dict()
    es2 = EarlyStopping(monitor="val_mse", patience=50)
    restored = {}

    class Peek(Callback):
        def on_train_begin(self, args, state, control, **kw):
            restored.update(es2.state_dict())

    _fit(tmp_path, max_steps=6, eval_strategy="steps", eval_steps=2, callbacks=[es2, Peek()]).fit(
        _net(), job.data(), job.data(8, seed=1), resume_from_checkpoint=True)
    assert restored == saved and saved  # EarlyStopping's best score and wait counter came back


class HFStyle:
    """An HF ``TrainerCallback`` with ``ExportableState``: restored only with
    ``restore_callback_states_from_checkpoint=True`` (HF rule)."""

    def __init__(self) -> None:
        self.counter = 0

    def on_step_end(self, args, state, control, **kw):
        self.counter += 1

    def state(self):
        return {"args": {}, "attributes": {"counter": self.counter}}


@pytest.mark.parametrize("restore", [False, True])
def test_F_LOOP_6_hf_callback_state_follows_restore_callback_states_from_checkpoint(tmp_path, restore):
    _fit(tmp_path, max_steps=3, save_steps=3, callbacks=[HFStyle()]).fit(_net(), job.data())
    cb = HFStyle()
    _fit(tmp_path, max_steps=5, save_strategy="no", callbacks=[cb],
         restore_callback_states_from_checkpoint=restore).fit(_net(), job.data(), resume_from_checkpoint=True)
    assert cb.counter == (5 if restore else 2)


def test_F_CKPT_1_save_on_each_node_writer_rule():
    """Rank 0 writes; with save_on_each_node the first process of every node does (HF ``should_save``)."""
    def fake(rank, local, each):
        return SimpleNamespace(args=FitArguments(save_on_each_node=each), local_rank=local, is_global_zero=rank == 0)

    assert [is_writer(fake(r, r % 2, False)) for r in range(4)] == [True, False, False, False]
    assert [is_writer(fake(r, r % 2, True)) for r in range(4)] == [True, False, True, False]


def test_F_CKPT_1_hf_model_checkpoint_loads_with_from_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    ids = torch.randint(1, 50, (16, 6))
    data = [{"input_ids": ids[i], "labels": torch.tensor(i % 2)} for i in range(16)]
    fit = _fit(tmp_path, max_steps=2, save_steps=2)
    fit.fit(model, data)
    back = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "out" / "checkpoint-2"))
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    # and a resumed HF-model run continues from it
    torch.manual_seed(1)
    fresh = transformers.BertForSequenceClassification(cfg)
    fit2 = _fit(tmp_path, max_steps=2, save_strategy="no")
    fit2.fit(fresh, data, resume_from_checkpoint=True)
    assert fit2.state.global_step == 2
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())
