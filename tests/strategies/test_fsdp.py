"""FSDP2 strategy (F-STRAT-4, F-PREC-3) and its sharded checkpoints (F-CKPT-5), with real processes: 2 CPU
workers on gloo, launched by taskfit from a plain ``python fsdp_job.py`` (``devices=2``).

Equivalence: 32 samples, per-device batch 2 on 2 processes == one process with batch 4, same seed and data, after
4 optimizer steps with clipping engaged (max_grad_norm=0.5 < the norms seen), within 1e-6 (fp32: the sums are
reordered by the reduce-scatter); the same with 2-step accumulation. Checkpoints: uninterrupted FSDP run of 10
steps saving at each epoch end (step 8 ends epoch 1) == the run SIGKILLed after step 9 and resumed, bitwise; the FSDP
checkpoint also resumes a single-device and a DDP run to the same weights (1e-6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fsdp_job import Tagger  # noqa: E402

pytestmark = pytest.mark.distributed
TOL = 1e-6


def run_job(tmp_path, name: str, expect_kill: bool = False, **cfg) -> dict:
    """Run ``fsdp_job.py`` with ``cfg`` in fresh processes; rank 0's result (``{}`` when killed)."""
    out = tmp_path / name
    cfg = {"out": str(out), "result": str(tmp_path / f"{name}.pt"), "bs": 2, **cfg}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": HERE}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fsdp_job.py"), str(path)], env=env,
                          capture_output=True, text=True, timeout=240)
    if expect_kill:
        assert proc.returncode != 0, proc.stdout[-2000:]
        return {}
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(str(tmp_path / f"{name}.rank0.pt"), weights_only=False)


def fsdp(tmp_path, name: str, fsdp_args: dict | None = None, **cfg) -> dict:
    return run_job(tmp_path, name, strategy="fsdp", devices=2, args=fsdp_args or {}, **cfg)


def max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)  # save_model writes the keys of a single-device run
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def losses(result: dict) -> list[float]:
    return [r["loss"] for r in result["log"] if "loss" in r]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, batch 4 (= 2 processes x 2), with and without 2-step accumulation."""
    cache = {}

    def get(accum: int) -> dict:
        if accum not in cache:
            cache[accum] = run_job(tmp_path_factory.mktemp("single"), "single", bs=4, accum=accum, max_grad_norm=0.5)
        return cache[accum]

    return get


CASES = {  # name: (FitArguments of the FSDP run, accumulation, expected mesh, expected units)
    "full_shard_auto_wrap": ({"fsdp": "full_shard auto_wrap"}, 1, (2,), ["blocks.1", "blocks.0"]),
    "full_shard_auto_wrap_accum": ({"fsdp": "full_shard auto_wrap"}, 2, (2,), ["blocks.1", "blocks.0"]),
    "shard_grad_op_accum": ({"fsdp": ["shard_grad_op"]}, 2, (2,), []),
    "no_shard_accum": ({"fsdp": "no_shard auto_wrap"}, 2, (2, 1), ["blocks.1", "blocks.0"]),
    "hybrid_shard": ({"fsdp": "hybrid_shard auto_wrap"}, 1, (1, 2), ["blocks.1", "blocks.0"]),
    "hybrid_shard_mesh_2x1_accum": ({"fsdp": "hybrid_shard", "fsdp_config": {"device_mesh": [2, 1]}}, 2, (2, 1), []),
    "offload_accum": ({"fsdp": "full_shard offload auto_wrap"}, 2, (2,), ["blocks.1", "blocks.0"]),
    "by_size_min_num_params_60": ({"fsdp": "full_shard auto_wrap", "fsdp_min_num_params": 60}, 1, (2,),
                                  ["blocks.0.lin", "blocks.1.lin", "embed"]),
    "by_class_options_activation_checkpointing": (
        {"fsdp": "full_shard", "fsdp_config": {
            "transformer_layer_cls_to_wrap": ["Block"], "activation_checkpointing": True, "forward_prefetch": True,
            "backward_prefetch": "NO_PREFETCH", "limit_all_gathers": True, "use_orig_params": True,
            "sync_module_states": True, "cpu_ram_efficient_loading": True}}, 2, (2,), ["blocks.1", "blocks.0"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_F_STRAT_4_fsdp_two_processes_match_one_process_with_the_double_batch(case, tmp_path, single):
    """F-STRAT-4: every sharding strategy (and offload, size/class auto-wrap, activation checkpointing, the
    prefetch options) trains exactly like one process with batch 2b; parameters are DTensors and the expected
    modules became FSDP units; ``save_model`` writes full safetensors with single-device keys."""
    args, accum, mesh, units = CASES[case]
    ref = single(accum)
    got = fsdp(tmp_path, case, args, accum=accum, max_grad_norm=0.5)
    assert got["strategy"] == "FSDPStrategy" and got["world_size"] == 2
    assert set(got["param_types"].values()) == {"DTensor"}
    assert got["mesh"] == mesh
    assert sorted(got["wrapped"]) == sorted(units)
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert losses(got) == pytest.approx(losses(ref), abs=2e-6)  # logged rounded to 6 decimals
    norms = [r["grad_norm"] for r in got["log"] if "grad_norm" in r]
    assert norms == pytest.approx([r["grad_norm"] for r in ref["log"] if "grad_norm" in r], abs=1e-5)
    assert max(norms) > 0.5  # clipping engaged: the global norm over both shards was computed
    if "offload" in case:
        assert got["options"]["offload_params"] is True and got["offloaded"] == ["cpu"]
    if "activation" in case:
        assert got["options"]["activation_checkpointing"] and got["options"]["forward_prefetch"]
        assert got["options"]["backward_prefetch"] == "no_prefetch"


def test_F_PREC_3_bf16_mixed_uses_the_fsdp_mixed_precision_policy(tmp_path, single):
    """F-PREC-3: precision='bf16-mixed' -> MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32);
    the sharded master weights stay fp32 and training follows the fp32 run to bf16 accuracy."""
    ref = single(1)
    got = fsdp(tmp_path, "bf16", {"fsdp": "full_shard auto_wrap", "precision": "bf16-mixed"}, max_grad_norm=0.5)
    assert "param_dtype=torch.bfloat16" in got["mp"] and "reduce_dtype=torch.float32" in got["mp"]
    assert got["dtypes"] == ["torch.float32"]
    assert all(w.dtype == torch.float32 for w in got["weights"].values())
    # bf16 compute: close, not equal; AdamW normalises each update, so a bf16 gradient error moves a weight by up
    # to lr (0.05) per step: after 4 steps at most 0.2
    assert 0 < max_diff(got["weights"], ref["weights"]) < 0.2
    assert losses(got) == pytest.approx(losses(ref), abs=3e-2)


@pytest.fixture(scope="module")
def reference_with_checkpoint(tmp_path_factory):
    """Uninterrupted FSDP run: 10 steps (8 per epoch), sharded checkpoints at each epoch end (steps 8 and 10),
    evaluation at the end."""
    tmp = tmp_path_factory.mktemp("ref")
    cfg = dict(steps=10, eval=True)
    result = fsdp(tmp, "ref", {"fsdp": "full_shard auto_wrap", "save_strategy": "epoch"}, **cfg)
    return result, str(tmp / "ref" / "checkpoint-8"), cfg


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_F_CKPT_5_fsdp_sigkill_then_resume_equals_uninterrupted_run(state_dict_type, tmp_path,
                                                                     reference_with_checkpoint):
    """F-CKPT-5: sharded (each rank writes its DCP shard under shards/, no full gather) and full checkpoints
    resume exactly after every process was SIGKILLed."""
    ref, _, cfg = reference_with_checkpoint
    args = {"fsdp": "full_shard auto_wrap", "save_strategy": "epoch", "fsdp_config": {"state_dict_type": state_dict_type}}
    fsdp(tmp_path, "run", args, kill=9, expect_kill=True, **cfg)
    ckpt = tmp_path / "run" / "checkpoint-8"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    files = manifest["files"]
    if state_dict_type == "sharded":
        assert {"shards/__0_0.distcp", "shards/__1_0.distcp", "shards/.metadata"} <= set(files)
        assert "model.safetensors" not in files and "optimizer.pt" not in files
    else:
        assert "model.safetensors" in files and "optimizer.pt" in files and not any(f.startswith("shards/") for f in files)
    resumed = fsdp(tmp_path, "run", args, resume=True, **cfg)
    assert max_diff(resumed["weights"], ref["weights"]) == 0.0
    assert losses(resumed) == losses(ref)[-len(losses(resumed)):]
    assert resumed["eval"]["eval_loss"] == ref["eval"]["eval_loss"]


def test_F_CKPT_5_fsdp_resume_restores_every_ranks_unlogged_loss_sum(tmp_path):
    """Logging every 3 steps, a checkpoint at the end of epoch 1 (step 8) holds each rank's loss sum of steps 7-8,
    not logged yet; killed after step 9, the resumed run logs the uninterrupted run's losses and train_loss."""
    cfg = dict(steps=10, logging_steps=3, dropout=0.1)
    args = {"fsdp": "full_shard auto_wrap", "save_strategy": "epoch"}
    ref = fsdp(tmp_path, "ref", args, **cfg)
    fsdp(tmp_path, "run", args, kill=9, expect_kill=True, **cfg)
    resumed = fsdp(tmp_path, "run", args, resume=True, **cfg)
    assert resumed["log"] == ref["log"] and resumed["loss"] == ref["loss"]
    assert max_diff(resumed["weights"], ref["weights"]) == 0.0


def test_F_CORE_3_fsdp_fit_twice_on_one_fit_equals_a_fresh_fit(tmp_path):
    """A second fit() with a fresh model on the same Fit shards it anew and re-points the new optimizer at the
    new shards: it ends equal to a fresh Fit."""
    cfg = dict(steps=6, logging_steps=2, dropout=0.1)
    args = {"fsdp": "full_shard auto_wrap"}
    twice = fsdp(tmp_path, "twice", args, twice=True, **cfg)
    fresh = fsdp(tmp_path, "fresh", args, **cfg)
    assert max_diff(twice["weights"], fresh["weights"]) == 0.0 and twice["loss"] == fresh["loss"]


@pytest.mark.parametrize("target", ["single_device", "ddp"])
def test_F_CKPT_5_fsdp_checkpoint_resumes_a_single_device_and_a_ddp_run(target, tmp_path, reference_with_checkpoint):
    """F-CKPT-5: the 2-process FSDP shards are converted to one full state dict (model and optimizer) and resume
    a single-device run (batch 4) and a DDP run (2 x 2) at the epoch boundary to the FSDP run's weights."""
    ref, ckpt, cfg = reference_with_checkpoint
    if target == "single_device":
        got = run_job(tmp_path, target, bs=4, resume=ckpt, **cfg)
    else:
        got = run_job(tmp_path, target, strategy="ddp", devices=2, resume=ckpt, **cfg)
    assert got["strategy"] == ("SingleDeviceStrategy" if target == "single_device" else "DDPStrategy")
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert losses(got)[-2:] == pytest.approx(losses(ref)[-2:], abs=2e-6)


def test_F_CKPT_5_convert_checkpoint_writes_full_files_with_single_device_keys(tmp_path, reference_with_checkpoint):
    """F-CKPT-5: ``convert_checkpoint`` (one process, no process group) writes model.safetensors with the keys
    of ``Tagger().state_dict()`` and an index-keyed optimizer.pt that a plain AdamW loads."""
    from safetensors.torch import load_file

    from taskfit.strategies.checkpoint_shards import convert_checkpoint

    _, ckpt, _ = reference_with_checkpoint
    state = convert_checkpoint(ckpt, str(tmp_path / "full"))
    weights = load_file(str(tmp_path / "full" / "model.safetensors"))
    model = Tagger()
    assert sorted(weights) == sorted(model.state_dict()) == sorted(state["model"])
    model.load_state_dict(weights)
    groups = state["optim"]["param_groups"]  # taskfit's AdamW: decay / no-decay groups
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [params[n] for n in g["params"]]} for g in groups])
    opt.load_state_dict(torch.load(str(tmp_path / "full" / "optimizer.pt")))
    assert sorted(n for g in groups for n in g["params"]) == sorted(params)
    assert int(opt.state_dict()["state"][0]["step"]) == 8
    assert all(torch.equal(opt.state[p]["exp_avg"], state["optim"]["state"][n]["exp_avg"]) for n, p in params.items())


# -- clear errors before any work (one process, no launch) -----------------------------------------------------
def _fit(**kw):
    from taskfit import Fit

    return Fit(output_dir="/tmp/taskfit-fsdp-errors", report_to="none", disable_tqdm=True, **kw)


@pytest.mark.parametrize("kwargs, match", [
    ({"fsdp": "full_shard", "fsdp_config": {"activation_checkpointing": True}, "gradient_checkpointing": True},
     "activation_checkpointing=True and gradient_checkpointing=True"),
    ({"strategy": "fsdp", "fsdp_config": {"sharding_strategy": "zero3"}}, "Valid choices: full_shard"),
    ({"fsdp": "full_shard", "fsdp_config": {"limit_all_gather": True}}, "Did you mean \"limit_all_gathers\""),
    ({"fsdp": "full_shard", "fsdp_config": {"state_dict_type": "LOCAL_STATE_DICT"}}, "Valid choices: full, sharded"),
    ({"fsdp": "full_shard", "fsdp_config": {"min_num_params": 10, "transformer_layer_cls_to_wrap": "Block"}},
     "either min_num_params"),
    ({"fsdp": "full_shard", "fsdp_config": {"xla": True}}, "xla_fsdp"),
    ({"fsdp": "full_shard", "fsdp_config": {"device_mesh": [2]}}, r"\(replicate, shard\)"),
    ({"fsdp": "full_shard", "strategy": "ddp"}, "conflicts with strategy='ddp'"),
])
def test_F_STRAT_4_bad_fsdp_options_fail_before_work_naming_the_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _fit(**kwargs)


def test_F_STRAT_4_hf_option_forms_resolve(tmp_path):
    """F-STRAT-4: ``fsdp`` words + ``fsdp_config`` from a JSON file (accelerate's ``fsdp_`` prefixed keys) select
    the FSDP strategy; an unknown layer class fails at wrapping time naming the classes present; auto-wrap
    defaults to the model's ``_no_split_modules``."""
    from taskfit.strategies import FSDPStrategy

    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_backward_prefetch": "backward_post", "fsdp_state_dict_type": "FULL_STATE_DICT",
                                "fsdp_offload_params": "true", "fsdp_sync_module_states": False}))
    s = _fit(fsdp="shard_grad_op auto_wrap", fsdp_config=str(path)).strategy
    assert isinstance(s, FSDPStrategy)
    o = s.options
    assert (o.sharding_strategy, o.backward_prefetch, o.state_dict_type, o.offload_params, o.sync_module_states,
            o.auto_wrap) == ("shard_grad_op", "backward_post", "full", True, False, True)
    assert [n for n, _ in s.auto_wrap_units(Tagger())] == ["blocks.1", "blocks.0"]
    s = _fit(strategy="fsdp2", fsdp_transformer_layer_cls_to_wrap="Nope").strategy
    with pytest.raises(ValueError, match=r"Could not find the transformer layer class 'Nope'.*'Block'"):
        s.auto_wrap_units(Tagger())
    s = _fit(strategy="fsdp", fsdp_min_num_params=100).strategy
    assert sorted(n for n, _ in s.auto_wrap_units(Tagger())) == ["blocks.0.lin", "blocks.1.lin"]  # innermost


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_F_CKPT_3_fsdp_load_best_model_at_end_restores_the_best_step(state_dict_type, tmp_path):
    """load_best_model_at_end under FSDP reads the best checkpoint's shards (or cuts its full weights into
    shards) on every rank: the final weights equal a single-device run that loaded its best checkpoint. With
    greater_is_better=True on the eval loss the best step is an early one, not the last."""
    best = {"eval_strategy": "steps", "eval_steps": 1, "save_strategy": "steps", "save_steps": 1,
            "load_best_model_at_end": True, "metric_for_best_model": "loss", "greater_is_better": True}
    one = run_job(tmp_path, "one", bs=4, eval=True, args=best)
    two = fsdp(tmp_path, "two", {**best, "fsdp": "full_shard auto_wrap",
                                 "fsdp_config": {"state_dict_type": state_dict_type}}, eval=True)
    steps = [r["best_global_step"] for r in (one["log"][-1], two["log"][-1])]
    assert steps[0] == steps[1] < 4
    assert max_diff(one["weights"], two["weights"]) < TOL
