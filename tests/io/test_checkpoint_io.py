"""The CheckpointIO interface and its local/fsspec implementation (F-CKPT-4 base; the full checkpoint
feature set lands with the checkpoint issue) and the checkpoint folders the core writes (F-CORE-7)."""

import json
import os

import pytest
import torch
from helpers.models import Classifier
from safetensors.torch import load_file
from taskfit import Fit, TaskModule
from taskfit.io import TorchCheckpointIO, write_bytes_atomic


def test_F_CKPT_4_save_load_remove_local_and_memory(tmp_path):
    io = TorchCheckpointIO()
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7, "nested": {"lr": 0.1}}
    for path in (str(tmp_path / "a" / "ckpt.pt"), f"file://{tmp_path}/b/ckpt.pt", "memory://taskfit-test/ckpt.pt"):
        io.save_checkpoint(state, path)
        back = io.load_checkpoint(path)
        assert torch.equal(back["w"], state["w"]) and back["step"] == 7 and back["nested"] == {"lr": 0.1}
        io.remove_checkpoint(path)
        with pytest.raises(FileNotFoundError):
            io.load_checkpoint(path)
    assert not [p for p in os.listdir(tmp_path / "a") if ".tmp-" in p]  # no temporary files left behind


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "f.bin"
    write_bytes_atomic(str(path), b"old")
    write_bytes_atomic(str(path), b"new contents")
    assert path.read_bytes() == b"new contents" and os.listdir(tmp_path) == ["f.bin"]


def test_weights_only_loading_refuses_arbitrary_objects(tmp_path):
    io = TorchCheckpointIO()
    path = str(tmp_path / "x.pt")
    io.save_checkpoint({"obj": object()}, path)
    with pytest.raises(Exception):
        io.load_checkpoint(path)  # weights_only=True by default
    assert "obj" in io.load_checkpoint(path, weights_only=False)


def test_safetensors_weights_with_tied_tensors(tmp_path):
    io = TorchCheckpointIO()
    w = torch.randn(4, 4)
    io.save_weights({"a": w, "b": w}, str(tmp_path / "m.safetensors"))
    back = io.load_weights(str(tmp_path / "m.safetensors"))
    assert torch.equal(back["a"], w) and torch.equal(back["b"], w)


def test_F_CORE_7_checkpoint_folders_and_save_model(tmp_path):
    ds = torch.utils.data.TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    fit = Fit(output_dir=str(tmp_path), max_steps=6, save_strategy="steps", save_steps=4,
              per_device_train_batch_size=4, disable_tqdm=True, report_to="none")
    module = Classifier(features=3, classes=2, seed=None)
    fit.fit(module, ds)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-")) == ["checkpoint-4", "checkpoint-6"]
    ck = tmp_path / "checkpoint-6"
    assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "training_state.pt",
            "rng_state_0.pt", "trainer_state.json", "fit_args.json", "manifest.json",
            "rng_state.pth"} == set(os.listdir(ck))  # one process: HF's RNG file too
    weights = load_file(str(ck / "model.safetensors"))
    assert torch.equal(weights["layer.weight"], module.layer.weight.detach())
    ts = torch.load(ck / "training_state.pt", weights_only=True)
    assert ts["state"]["global_step"] == 6 and "python" in torch.load(ck / "rng_state_0.pt", weights_only=True)
    assert torch.load(ck / "optimizer.pt", weights_only=True)["state"]
    assert json.loads((ck / "fit_args.json").read_text())["save_steps"] == 4
    out = fit.save_model(str(tmp_path / "final"))
    assert torch.equal(load_file(os.path.join(out, "model.safetensors"))["layer.bias"], module.layer.bias.detach())
    assert json.loads((tmp_path / "final" / "config.json").read_text())["num_parameters"] == 8


def test_F_CORE_7_save_model_of_taskmodule_wrapping_hf_model_loads_with_from_pretrained(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=2)

    # kept local: wraps a transformers model whose saved folder is read back by from_pretrained
    class Wrapper(TaskModule):
        def __init__(self):
            super().__init__()
            self.model = transformers.BertForSequenceClassification(cfg)

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

    ids = torch.randint(1, 50, (16, 6))
    data = [{"input_ids": ids[i], "labels": torch.tensor(i % 2)} for i in range(16)]
    fit = Fit(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, disable_tqdm=True,
              report_to="none", save_strategy="no")
    module = Wrapper()
    fit.fit(module, data)
    folder = fit.save_model(str(tmp_path / "final"))
    back = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    module.eval()
    with torch.no_grad():
        assert torch.allclose(back(input_ids=ids[:2]).logits, module.model(input_ids=ids[:2]).logits, atol=1e-6)
