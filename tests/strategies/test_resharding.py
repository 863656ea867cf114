"""F-SCALE-2: a sharded (``torch.distributed.checkpoint``) checkpoint written by N processes resumes on M != N
processes and under another strategy (model parallel <-> FSDP <-> DDP <-> single device) with weights and
optimizer state intact: resumed at an epoch boundary, the run ends equal (1e-5) to the uninterrupted one in
weights and AdamW state. A mid-epoch resume that changes the data-parallel size continues by HF's rule (position
from ``global_step``). Real gloo processes (``mp_job.py``); ``distributed`` and ``slow`` (``make test-dist``); one
single-process case is only ``slow``.

Every run trains on the same global batch of 8 samples (32 samples: 4 steps per epoch, 8 steps) with a
checkpoint every 2 steps (steps 4 and 8 end an epoch, 2 and 6 are mid-epoch)."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mp_helpers import TOL, losses, max_diff, optim_diff, run_job  # noqa: E402


#: name: mp_job config of one layout with a global batch of 8
LAYOUTS = {
    "single": dict(bs=8),
    "tp2": dict(bs=8, mesh=[1, 2], devices=2),  # model parallel, 2 processes, tensor parallel only
    "mesh2x2": dict(bs=4, mesh=[2, 2], devices=4),  # model parallel, 4 processes, FSDP x TP
    "fsdp2": dict(bs=4, strategy="fsdp", devices=2),
    "fsdp4": dict(bs=2, strategy="fsdp", devices=4),
    "ddp2": dict(bs=4, strategy="ddp", devices=2),
}
ARGS = {"save_strategy": "steps", "save_steps": 2}


def layout(name: str, **extra) -> dict:
    return {**LAYOUTS[name], "steps": 8, "args": ARGS, **extra}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Uninterrupted 8-step runs of the source layouts, run once each on first use."""
    cache: dict[str, tuple[dict, str]] = {}

    def get(name: str) -> tuple[dict, str]:
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            cache[name] = (run_job(tmp, "src", **layout(name)), str(tmp / "src"))
        return cache[name]

    return get


CASES = [  # (source, target): 2 -> 1, 2 -> 4, 4 -> 2, 4 -> 1, and across strategies
    ("tp2", "single"), ("tp2", "mesh2x2"), ("tp2", "fsdp4"), ("tp2", "ddp2"),
    ("mesh2x2", "tp2"), ("mesh2x2", "single"),
    ("fsdp2", "tp2"), ("single", "mesh2x2"),
]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("source, target", CASES, ids=[f"{s}-to-{t}" for s, t in CASES])
def test_F_SCALE_2_checkpoint_resumes_on_another_world_size_and_strategy(source, target, tmp_path, sources):
    """F-SCALE-2: resumed from the source's epoch-end checkpoint (step 4), the target layout runs steps 5-8 and
    ends equal to the source's uninterrupted run: weights, AdamW state (exp_avg, exp_avg_sq, step) and losses."""
    ref, folder = sources(source)
    got = run_job(tmp_path, "target", resume=os.path.join(folder, "checkpoint-4"), **layout(target))
    assert got["world_size"] == LAYOUTS[target].get("devices", 1)
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert optim_diff(got["optim"], ref["optim"]) < TOL
    assert losses(got)[-4:] == pytest.approx(losses(ref)[-4:], abs=2e-6)


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_2_mid_epoch_resume_on_another_data_parallel_size_continues_as_hf(tmp_path, sources):
    """F-SCALE-2: the step-2 checkpoint of the 2-process tensor-parallel run (1 data-parallel rank) is mid-epoch:
    resumed on the 2 x 2 mesh (2 data-parallel ranks) it continues as ``transformers.Trainer`` does (position
    from ``global_step``, with a warning naming both world sizes) and trains to the planned step 8."""
    _, folder = sources("tp2")
    got = run_job(tmp_path, "continued", resume=os.path.join(folder, "checkpoint-2"), **layout("mesh2x2"))
    assert got["world_size"] == 4
    assert got["plan"]["global_step"] == 8


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_2_mid_epoch_resume_with_the_same_data_parallel_size_is_exact(tmp_path, sources):
    """F-SCALE-2: tensor-parallel ranks read the same samples, so the 2-process TP run's mid-epoch checkpoint
    (step 6) resumes on one process (data-parallel size 1 both times) at the right sample and ends equal."""
    ref, folder = sources("tp2")
    got = run_job(tmp_path, "mid", resume=os.path.join(folder, "checkpoint-6"), **layout("single"))
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert optim_diff(got["optim"], ref["optim"]) < TOL


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_2_model_parallel_checkpoint_converts_to_full_weights(tmp_path, sources):
    """F-SCALE-2: ``taskfit convert`` turns the 4-process mesh checkpoint's DCP shards into full
    ``model.safetensors`` (single-device keys) equal to the run's final weights."""
    from safetensors.torch import load_file

    from taskfit.cli.checkpoints import convert_main

    ref, folder = sources("mesh2x2")
    manifest = json.loads(open(os.path.join(folder, "checkpoint-8", "manifest.json")).read())
    assert manifest["world_size"] == 4 and manifest["data_parallel_size"] == 2
    assert convert_main([os.path.join(folder, "checkpoint-8"), str(tmp_path / "full")]) == 0
    full = load_file(str(tmp_path / "full" / "model.safetensors"))
    assert max_diff(full, ref["weights"]) == 0.0


@pytest.mark.slow
def test_F_SCALE_2_checkpoint_after_an_epoch_s_last_batch_resumes_in_another_layout(tmp_path):
    """F-SCALE-2: a step-based checkpoint taken after the last batch of an epoch holds no position inside it: a
    run with another batch size (8 -> 4: 4 -> 8 batches per epoch) resumes it at the start of the next epoch
    instead of being refused as mid-epoch (one process)."""
    import mp_job

    out = str(tmp_path / "run")
    mp_job.run({"out": out, "bs": 8, "steps": 4, "args": {"save_strategy": "steps", "save_steps": 4}})
    got = mp_job.run({"out": out, "bs": 4, "steps": 10, "resume": os.path.join(out, "checkpoint-4")})
    assert got["positions"] == [(1, b) for b in range(1, 7)]  # steps 5-10: batches 1-6 of epoch 1
