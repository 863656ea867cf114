"""F-HF-1: the resume and argument gaps (G7, G11, G12 of tests/peers/hf_gaps.md) found by transformers' own
Trainer tests, each asserted against transformers itself as the oracle: the same scenario runs under
``transformers`` and under ``taskfit.hf``."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
import torch

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, both  # noqa: E402


def _trainer(m: Any, out: str, length: int = 32, **kw: Any) -> Any:
    m.set_seed(42)
    return m.Trainer(model=RegressionModel(), args=args_for(m, out, **kw), train_dataset=RegressionDataset(
        length=length))


def test_bad_resume_path_raises_hf_message_G7_F_HF_1(tmp_path):
    """G7: a path that is no checkpoint raises a ValueError starting as HF's ("Can't find a valid checkpoint
    at ...")."""
    def run(m, out):
        with pytest.raises(ValueError) as err:
            _trainer(m, out, max_steps=1).train(resume_from_checkpoint=os.path.join(out, "checkpoint-5-bogus"))
        return "Can't find a valid checkpoint at" in str(err.value)
    assert list(both(run, tmp_path)) == [True, True]


def test_resume_true_without_checkpoint_raises_as_hf_G7_F_HF_1(tmp_path):
    """G7: ``train(resume_from_checkpoint=True)`` with no checkpoint in ``output_dir`` raises HF's "No valid
    checkpoint found in output directory" under both Trainers; ``Fit.fit`` (and ``"auto"`` under the HF door)
    starts from scratch instead, as a restart loop's first run needs; with a checkpoint, True resumes from it."""
    import taskfit.hf
    import transformers

    for m in (transformers, taskfit.hf):
        out = str(tmp_path / m.__name__)
        with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory \(.*\)"):
            _trainer(m, out, max_steps=1).train(resume_from_checkpoint=True)
    out = str(tmp_path / "tf")
    assert _trainer(taskfit.hf, out, max_steps=1, save_strategy="steps", save_steps=1).train(
        resume_from_checkpoint="auto").global_step == 1
    resumed = _trainer(taskfit.hf, out, max_steps=2, logging_steps=1)
    assert resumed.train(resume_from_checkpoint=True).global_step == 2
    assert resumed.state.log_history[0]["step"] == 2  # continued from checkpoint-1: only step 2 ran here


def _shard(folder: str) -> None:
    """Replace ``model.safetensors`` by HF's index and one shard per tensor (as ``save_pretrained`` writes a
    large model)."""
    from safetensors.torch import load_file, save_file

    state = load_file(os.path.join(folder, "model.safetensors"))
    os.remove(os.path.join(folder, "model.safetensors"))
    names = [f"model-{i + 1:05d}-of-{len(state):05d}.safetensors" for i in range(len(state))]
    for (key, tensor), name in zip(state.items(), names):
        save_file({key: tensor.contiguous()}, os.path.join(folder, name), metadata={"format": "pt"})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(zip(state, names))}, f)


@pytest.mark.slow  # two trainings and a resume per side
def test_resume_from_resharded_weights_G7_F_HF_1(tmp_path):
    """G7: a checkpoint whose weights were re-sharded (index + shards) resumes and ends with the uninterrupted
    run's weights, as under HF."""
    def run(m, out):
        full = _trainer(m, out, save_strategy="steps", save_steps=2, max_steps=4)
        full.train()
        _shard(os.path.join(out, "checkpoint-2"))
        again = _trainer(m, out, save_strategy="steps", save_steps=2, max_steps=4)
        again.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
        return [round(p.item(), 6) for p in full.model.parameters()], [round(p.item(), 6) for p in
                                                                        again.model.parameters()]
    hf, tf = both(run, tmp_path)
    assert hf[0] == hf[1] and tf[0] == tf[1] and hf == tf


def test_resume_with_changed_layout_continues_as_hf_G7_F_HF_1(tmp_path):
    """G7: resuming a mid-epoch checkpoint with another batch size, accumulation and dataset length continues
    as HF (``global_step x accumulation`` micro-batches of the new loader skipped) to the same step and weights,
    and warns in HF's words on the ``transformers`` logger."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    def run(m, out):
        _trainer(m, out, length=32, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                 save_strategy="steps", save_steps=2, logging_steps=2, max_steps=3).train()
        t = _trainer(m, out, length=64, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                     save_strategy="steps", save_steps=4, logging_steps=2, max_steps=3)
        verbosity = hf_logging.get_verbosity()  # an earlier test's log_level may have raised it (both doors set it)
        hf_logging.set_verbosity_warning()
        try:
            with CaptureLogger(hf_logging.get_logger()) as cl:
                t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
        finally:
            hf_logging.set_verbosity(verbosity)
        return (t.state.global_step, [round(p.item(), 5) for p in t.model.parameters()],
                "save_steps: 4 (from args) != 2 (from trainer_state.json)" in cl.out,
                "per_device_train_batch_size: 8 (from args) != 4 (from trainer_state.json)" in cl.out)
    hf, tf = both(run, tmp_path)
    assert hf == tf
    assert hf[0] == 3 and hf[2:] == (True, True)


def test_training_arguments_normalised_as_hf_G11_F_HF_1(tmp_path, monkeypatch):
    """G11: ``~`` in ``output_dir`` expanded, ``torch_compile=True`` names the inductor backend, ``use_cpu``
    turns pin memory off, ``torch_empty_cache_steps`` takes only a positive int, the default folder is
    ``trainer_output``, a user subclass's ``torch.dtype`` field is kept and written by name."""
    import dataclasses

    import taskfit.hf
    import transformers

    monkeypatch.setenv("HOME", str(tmp_path))

    def run(m):
        @dataclasses.dataclass
        class WithDtype(m.TrainingArguments):
            dtype: torch.dtype = dataclasses.field(default=torch.float32)

        refused = []
        for bad in (1.0, "none", 0, -1):
            try:
                m.TrainingArguments(torch_empty_cache_steps=bad)
            except ValueError:
                refused.append(bad)
        return (m.TrainingArguments(output_dir="~/foo").output_dir,
                m.TrainingArguments(torch_compile=True).torch_compile_backend,
                m.TrainingArguments(use_cpu=True).dataloader_pin_memory, refused,
                m.TrainingArguments().output_dir, WithDtype(output_dir="x", dtype=torch.bfloat16).to_dict()["dtype"])
    assert run(transformers) == run(taskfit.hf) == (str(tmp_path / "foo"), "inductor", False, [1.0, "none", 0, -1],
                                                    "trainer_output", "bfloat16")


@pytest.mark.slow  # an optuna study per side
def test_hyperparameter_search_uses_the_trainers_datasets_G12_F_HF_1(tmp_path):
    """G12: ``hyperparameter_search`` without data searches over the ``train_dataset`` / ``eval_dataset`` given
    to the Trainer, as HF: every trial trains on them and is scored on the evaluation."""
    pytest.importorskip("optuna")
    logging.getLogger("optuna").setLevel(logging.WARNING)

    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(args=args_for(m, out, max_steps=2, eval_strategy="no"), train_dataset=RegressionDataset(
            length=16), eval_dataset=RegressionDataset(length=8, seed=1), model_init=lambda *a: RegressionModel())
        best = t.hyperparameter_search(
            hp_space=lambda trial: {"learning_rate": trial.suggest_categorical("learning_rate", [0.1])},
            direction="minimize", n_trials=1, backend="optuna")
        return best.hyperparameters, round(best.objective, 5)
    hf, tf = both(run, tmp_path)
    assert hf == tf
