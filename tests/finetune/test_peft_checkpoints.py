"""LoRA fine-tuning of a tiny Llama with PEFT adapters under ``taskfit.hf.Trainer`` against ``transformers.Trainer``
(the peer as oracle, the same user code, fp32 CPU, bitwise): training, the adapter checkpoint folders (PEFT's
layout, no frozen base), resume both ways, ``save_model`` and ``load_best_model_at_end``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it
pytest.importorskip("peft")

from finetune_common import adapter_weights, both, equal_rows, hf_names, lora_model, stable, weights  # noqa: E402

ROWS = equal_rows(16)  # 4 steps per epoch at batch 4
ADAPTER = {"adapter_model.safetensors", "adapter_config.json"}


def _trainer(m: Any, out: str, model: Any = None, **kw: Any) -> Any:
    options = dict(per_device_train_batch_size=4, max_steps=4, logging_steps=1, learning_rate=1e-2,
                   report_to="none", save_steps=2, use_cpu=True, lr_scheduler_type="cosine", warmup_steps=1)
    args = m.TrainingArguments(output_dir=out, **{**options, **kw})
    return m.Trainer(model=model if model is not None else lora_model(), args=args, train_dataset=ROWS,
                     eval_dataset=ROWS[:8])


def _train(m: Any, out: str, **kw: Any) -> tuple[list, dict, Any]:
    trainer = _trainer(m, out, **kw)
    trainer.train()
    return stable(trainer.state.log_history), weights(trainer.model), trainer


def _assert_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _config(path: str) -> dict:
    """An adapter_config.json's values; PEFT keeps ``target_modules`` as a set and writes it in the set's order,
    which varies between runs (string hashing), so that list is compared sorted."""
    with open(path) as f:
        cfg = json.load(f)
    if isinstance(cfg.get("target_modules"), list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    return cfg


def test_lora_checkpoint_holds_the_adapter_as_transformers_F_FT_3(tmp_path):
    """Training equals transformers' (log history, weights); ``checkpoint-2`` holds the adapter in PEFT's layout,
    the same config and tensor for tensor the weights transformers writes, plus the optimizer, scheduler,
    RNG and training state, and no full weights; the manifest lists what is written."""
    from safetensors.torch import load_file

    (hf_log, hf_w, _), (tf_log, tf_w, _) = both(_train, tmp_path)
    assert tf_log == hf_log
    _assert_equal(tf_w, hf_w)
    hf_dir, tf_dir = tmp_path / "hf" / "checkpoint-2", tmp_path / "tf" / "checkpoint-2"
    names = set(os.listdir(tf_dir))
    assert ADAPTER | {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin"}
    assert _config(tf_dir / "adapter_config.json") == _config(hf_dir / "adapter_config.json")
    _assert_equal(load_file(tf_dir / "adapter_model.safetensors"), load_file(hf_dir / "adapter_model.safetensors"))
    manifest = json.loads(_read(tf_dir / "manifest.json"))
    assert set(manifest["files"]) == names - {"manifest.json"}
    # the adapter is small: a fraction of the full weights
    full = sum(v.numel() for v in tf_w.values())
    assert sum(v.numel() for v in load_file(tf_dir / "adapter_model.safetensors").values()) < full / 10


def test_resume_adapter_checkpoint_is_exact_F_FT_3(tmp_path):
    """Resuming taskfit's adapter ``checkpoint-2`` with a freshly built PEFT model ends bitwise at the weights and
    log history of the uninterrupted run."""
    m = hf_names("tf")
    log, w, _ = _train(m, str(tmp_path / "run"))
    resumed = _trainer(m, str(tmp_path / "run"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    _assert_equal(weights(resumed.model), w)
    assert [r.get("loss") for r in stable(resumed.state.log_history)] == [r.get("loss") for r in log]


def test_resume_across_frameworks_F_FT_3(tmp_path):
    """An adapter checkpoint transformers wrote resumes under taskfit, and taskfit's under transformers; each ends
    bitwise at the weights of the uninterrupted run."""
    (_, hf_w, _), (_, tf_w, _) = both(_train, tmp_path)
    for writer, reader in (("hf", "tf"), ("tf", "hf")):
        trainer = _trainer(hf_names(reader), str(tmp_path / f"{writer}-to-{reader}"))
        trainer.train(resume_from_checkpoint=str(tmp_path / writer / "checkpoint-2"))
        _assert_equal(weights(trainer.model), hf_w)
    _assert_equal(tf_w, hf_w)


def test_checkpoint_and_save_model_load_with_peft_from_pretrained_F_FT_3(tmp_path):
    """``PeftModel.from_pretrained(base, folder)`` reads taskfit's checkpoint and the folder ``save_model`` wrote
    (the adapter, no full weights) back to the trained adapter weights."""
    from peft import PeftModel

    from finetune_common import tiny_llama

    _, _, trainer = _train(hf_names("tf"), str(tmp_path / "run"))
    trainer.save_model(str(tmp_path / "final"))
    assert ADAPTER <= set(os.listdir(tmp_path / "final"))
    assert "model.safetensors" not in os.listdir(tmp_path / "final")
    for folder in (tmp_path / "run" / "checkpoint-4", tmp_path / "final"):
        loaded = PeftModel.from_pretrained(tiny_llama(), str(folder), is_trainable=True)
        _assert_equal(adapter_weights(loaded), adapter_weights(trainer.model))


def test_load_best_model_at_end_with_adapters_F_FT_3(tmp_path):
    """``load_best_model_at_end`` reloads the best adapter checkpoint: the same best checkpoint, weights and log
    history as transformers (less the best-checkpoint keys taskfit adds to the last row, a documented difference
    in docs/hf.md)."""
    kw = dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss",
              greater_is_better=True, learning_rate=5e-2)  # the first evaluation is the best: something to reload
    (hf_log, hf_w, hf_t), (tf_log, tf_w, tf_t) = both(lambda m, out: _train(m, out, **kw), tmp_path)
    assert os.path.basename(tf_t.state.best_model_checkpoint) == os.path.basename(hf_t.state.best_model_checkpoint)
    _assert_equal(tf_w, hf_w)
    best = ("best_global_step", "best_metric", "best_model_checkpoint")
    assert [{k: v for k, v in row.items() if k not in best} for row in tf_log] == hf_log


def test_adapter_checkpoint_into_a_plain_model_is_refused_F_FT_3(tmp_path):
    """Resuming an adapter checkpoint into a model without adapters raises a CheckpointError that says so."""
    from taskfit.io.checkpoint_format import CheckpointError

    from finetune_common import tiny_llama

    m = hf_names("tf")
    _train(m, str(tmp_path / "run"), max_steps=2)
    trainer = _trainer(m, str(tmp_path / "other"), model=tiny_llama())
    with pytest.raises(CheckpointError, match="PEFT adapter weights"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))


def _two_adapters() -> Any:
    """LoRA with ``modules_to_save=["lm_head"]`` (trained in full, saved with the adapter) and a second, inactive
    adapter (PEFT saves it in a sub-folder named after it)."""
    from peft import LoraConfig

    model = lora_model(modules_to_save=["lm_head"])
    torch.manual_seed(5)
    model.add_adapter("second", LoraConfig(r=2, target_modules=["k_proj"]))
    return model


def test_modules_to_save_and_several_adapters_as_transformers_F_FT_3(tmp_path):
    """``modules_to_save`` and a second adapter: the same adapter files as transformers (the second one in its
    sub-folder, the same configs, tensor for tensor weights), and resume both ways ends bitwise at the weights
    of the uninterrupted run."""
    from safetensors.torch import load_file

    (hf_log, hf_w, _), (tf_log, tf_w, _) = both(lambda m, out: _train(m, out, model=_two_adapters()), tmp_path)
    assert tf_log == hf_log
    _assert_equal(tf_w, hf_w)
    hf_dir, tf_dir = tmp_path / "hf" / "checkpoint-2", tmp_path / "tf" / "checkpoint-2"
    for name in ("adapter_config.json", "second/adapter_config.json"):
        assert _config(tf_dir / name) == _config(hf_dir / name), name
    for name in ("adapter_model.safetensors", "second/adapter_model.safetensors"):
        _assert_equal(load_file(tf_dir / name), load_file(hf_dir / name))
    assert any("lm_head" in k for k in load_file(tf_dir / "adapter_model.safetensors"))
    manifest = json.loads(_read(tf_dir / "manifest.json"))
    assert {"second/adapter_model.safetensors", "second/adapter_config.json"} <= set(manifest["files"])
    for writer, reader in (("hf", "tf"), ("tf", "hf"), ("tf", "tf")):
        trainer = _trainer(hf_names(reader), str(tmp_path / f"{writer}-to-{reader}"), model=_two_adapters())
        trainer.train(resume_from_checkpoint=str(tmp_path / writer / "checkpoint-2"))
        _assert_equal(weights(trainer.model), hf_w)


def test_fit_door_writes_and_resumes_adapter_checkpoints_F_FT_3(tmp_path):
    """``taskfit.Fit`` with a PEFT model: the checkpoint holds the adapter, not the base, and resuming it with a
    fresh PEFT model ends bitwise at the uninterrupted run's weights (the same writer as the HF door)."""
    from taskfit import Fit

    def run(out: str, resume: str | None = None) -> dict:
        fit = Fit(output_dir=out, per_device_train_batch_size=4, max_steps=4, save_steps=2, learning_rate=1e-2,
                  report_to="none", use_cpu=True)
        model = lora_model()
        fit.fit(model, ROWS, resume_from_checkpoint=resume)
        return weights(model)

    full = run(str(tmp_path / "a"))
    names = set(os.listdir(tmp_path / "a" / "checkpoint-2"))
    assert ADAPTER <= names and "model.safetensors" not in names
    _assert_equal(run(str(tmp_path / "b"), resume=str(tmp_path / "a" / "checkpoint-2")), full)
