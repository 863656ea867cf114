"""DeepSpeed ZeRO with real processes on gloo and DeepSpeed's CPU accelerator (F-STRAT-6, F-CKPT-5, F-PREC-3).

Fast tests (default run): the config resolution ("auto" values, one error listing every conflict, presets, fp16
refused on CPU) and one real 1-process engine run with DeepSpeed's own optimizer and schedule in bf16.
Slow tests (``make test-deepspeed``; 2 processes each, ~30 s a run on 2 cores): ZeRO 1/2/3 with 2 x 2 samples and
accumulation 3 (windows 3, 3, 3, 1 per epoch) equal one process on batches of 4 within ``TOL``; exact resume after
SIGKILL under stage 2 and 3; conversion to fp32 weights that load into a single-device model; ``save_model``;
the offload presets (stage 2 optimizer offload, stage 3 optimizer + parameter offload; DeepSpeedCPUAdam, JIT-built
with gcc on first use) equal one process with the same optimizer within ``TOL`` and torch's AdamW within
``OFFLOAD_TOL``.

``TASKFIT_DEEPSPEED_SHM_COMM=0`` keeps DeepSpeed from JIT-compiling its shared-memory all-reduce op.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'taskfit[deepspeed]')")

from taskfit import Fit, FitArguments  # noqa: E402
from taskfit.connector import resolve_components  # noqa: E402
from taskfit.strategies.deepspeed_config import finalize_config, resolve_config  # noqa: E402

from jobs_common import job_env, run_job  # noqa: E402

pytestmark = pytest.mark.deepspeed
HERE = Path(__file__).parent
JOB = HERE / "deepspeed_job.py"
TOL = 1e-6  # fp32: the same sums reduced in another order (measured max difference ~6e-8)
# DeepSpeedCPUAdam vs torch.optim.AdamW after 8 steps at lr 0.1: measured max weight difference 1.5e-6 (the same
# update computed with other float32 arithmetic; 2-process offload vs 1-process offload, both CPUAdam: 1.8e-7)
OFFLOAD_TOL = 1e-5
# the run every 2-process test shares: 40 samples, 2 ranks x 2 samples, accumulation 3 -> windows 3, 3, 3, 1 per
# epoch, 8 optimizer steps (2 epochs), clipping at 0.5 (active: norms ~0.4-0.7), linear schedule with 2 warmup steps
BASE = {"bs": 2, "accum": 3, "n": 40, "steps": 8, "max_grad_norm": 0.5, "args": {"warmup_steps": 2}}


def run(tmp: Path, cfg: dict, name: str, expect_kill: bool = False) -> list[dict] | None:
    """Run the job with ``cfg`` in fresh processes; returns every rank's result (None when it was killed)."""
    return run_job(JOB, tmp, name, cfg, expect_kill=expect_kill)


def assert_close(a: dict, b: dict, tol: float = TOL) -> None:
    assert sorted(a) == sorted(b)
    for k, v in a.items():
        assert torch.allclose(v.float(), b[k].float(), atol=tol, rtol=0), (k, (v.float() - b[k].float()).abs().max())


# ---- config resolution (no processes) ----------------------------------------------------------------------
def _args(**kw) -> FitArguments:
    base = dict(output_dir="unused", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                learning_rate=3e-4, weight_decay=0.01, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-7,
                max_grad_norm=0.5, warmup_steps=3, report_to="none")
    return FitArguments(**{**base, **kw})


def test_F_STRAT_6_auto_values_are_filled_from_the_arguments():
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
           "optimizer": {"type": "auto", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                    "weight_decay": "auto"}},
           "scheduler": {"type": "auto", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}},
           "zero_optimization": {"stage": 3}}
    out = resolve_config(cfg, _args(), world_size=2, precision="bf16-mixed")
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"], out["train_batch_size"]) == \
        (4, 2, 16)
    assert out["gradient_clipping"] == 0.5 and out["bf16"]["enabled"] is True and out["fp16"]["enabled"] is False
    assert out["optimizer"] == {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-7,
                                                            "weight_decay": 0.01, "torch_adam": True}}
    assert out["scheduler"]["type"] == "WarmupDecayLR"  # lr_scheduler_type="linear"
    assert out["scheduler"]["params"]["warmup_max_lr"] == 3e-4 and out["scheduler"]["params"]["warmup_type"] == "linear"
    final = finalize_config(out, _args(), max_steps=100, warmup_steps=3)
    assert final["scheduler"]["params"]["warmup_num_steps"] == 3
    assert final["scheduler"]["params"]["total_num_steps"] == 100
    assert out["zero_optimization"]["stage"] == 3 and cfg["train_batch_size"] == "auto"  # the input is not modified
    # missing keys are filled too; max_grad_norm=0 disables clipping (DeepSpeed 0.19 would clip at 1.0)
    bare = resolve_config(None, _args(max_grad_norm=0.0, lr_scheduler_type="cosine"), world_size=1, precision="32-true")
    assert bare["gradient_clipping"] == 0.0 and bare["zero_optimization"]["stage"] == 2
    assert bare["bf16"]["enabled"] is False and "optimizer" not in bare and bare["zero_allow_untested_optimizer"]
    with_sched = resolve_config({"scheduler": {"type": "auto"}}, _args(lr_scheduler_type="cosine"), world_size=1,
                                precision="32-true")
    assert with_sched["scheduler"]["type"] == "WarmupCosineLR"


def test_F_STRAT_6_one_error_lists_every_conflict():
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "train_batch_size": 99,
           "gradient_clipping": 1.0, "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-7}}}
    with pytest.raises(ValueError) as err:
        Fit(output_dir="unused", report_to="none", deepspeed=cfg, per_device_train_batch_size=4,
            gradient_accumulation_steps=2, max_grad_norm=0.5, learning_rate=3e-4, adam_epsilon=1e-7)
    text = str(err.value)
    for part in ("train_micro_batch_size_per_gpu=8 but per_device_train_batch_size=4",
                 "gradient_accumulation_steps=4 but gradient_accumulation_steps=2",
                 "train_batch_size=99", "gradient_clipping=1.0 but max_grad_norm=0.5",
                 "bf16.enabled=True but precision='32-true'", "optimizer.params.lr=0.001 but learning_rate=0.0003",
                 "in 6 place(s)"):
        assert part in text, (part, text)
    assert "params.eps" not in text and "betas" not in text  # equal values are no conflict
    assert '"auto"' in text  # says how to resolve


def test_F_STRAT_6_presets_hf_option_and_bad_values(tmp_path):
    fit = Fit(output_dir=str(tmp_path), report_to="none", strategy="deepspeed_stage_3_offload")
    zero = fit.strategy.config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert fit.strategy.config["optimizer"]["type"] == "AdamW"  # offload needs a DeepSpeed optimizer: mapped from optim
    assert "torch_adam" not in fit.strategy.config["optimizer"]["params"]  # offload uses DeepSpeedCPUAdam
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto"}))
    hf = Fit(output_dir=str(tmp_path), report_to="none", deepspeed=str(path))  # HF deepspeed= selects the strategy
    assert type(hf.strategy).__name__ == "DeepSpeedStrategy" and hf.strategy.zero_stage == 1
    assert hf.strategy.config["train_micro_batch_size_per_gpu"] == 8
    with pytest.raises(ValueError, match="zero_optimization.stage=1 but strategy stage=3"):
        Fit(output_dir=str(tmp_path), report_to="none", deepspeed=str(path), strategy="deepspeed_stage_3")
    with pytest.raises(ValueError, match="conflicts with strategy='ddp'"):
        Fit(output_dir=str(tmp_path), report_to="none", deepspeed=str(path), strategy="ddp")
    with pytest.raises(ValueError, match="optim='sgd' has none"):
        Fit(output_dir=str(tmp_path), report_to="none", strategy="deepspeed_stage_2_offload", optim="sgd")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Fit(output_dir=str(tmp_path), report_to="none", deepspeed=str(tmp_path / "missing.json"))


def test_F_PREC_3_fp16_is_refused_on_cpu_with_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"fp16\) is not supported by DeepSpeed on the CPU.*bf16-mixed"):
        Fit(output_dir=str(tmp_path), report_to="none", strategy="deepspeed_stage_2", fp16=True)
    with pytest.raises(ValueError, match="enables fp16"):
        Fit(output_dir=str(tmp_path), report_to="none", deepspeed={"fp16": {"enabled": True}})


def test_F_CKPT_5_convert_cli_refuses_a_folder_that_is_no_deepspeed_checkpoint(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "taskfit.cli.app", "convert", str(tmp_path / "nope"), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, env=job_env())
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_F_STRAT_6_one_process_engine_with_deepspeed_optimizer_schedule_and_bf16(tmp_path):
    """A real engine (1 process): the config's "auto" optimizer and scheduler become DeepSpeed's AdamW and
    WarmupDecayLR, whose learning rates equal taskfit's linear schedule; bf16 trains (loss falls)."""
    cfg = {**BASE, "bs": 4, "strategy": "deepspeed", "devices": 1,
           "args": {"warmup_steps": 2, "bf16": True, "deepspeed": {"optimizer": {"type": "auto"},
                                                                    "scheduler": {"type": "auto"}}}}
    (ds,) = run(tmp_path, cfg, "ds1")
    (ref,) = run(tmp_path, {**BASE, "bs": 4}, "ref1")
    assert ds["optimizer_type"] == "AdamW" and ds["engine_optimizer"] == "DeepSpeedZeroOptimizer"
    # the logged rate is the one each step used (HF 5): the 2 warmup steps use 0, then half the peak
    assert ds["lrs"] == pytest.approx(ref["lrs"], abs=1e-12)
    assert ref["lrs"][:2] == pytest.approx([0.0, 0.05])
    losses = [r["loss"] for r in ds["log"] if "loss" in r]
    assert losses[-1] < losses[0] and all(torch.isfinite(v).all() for v in ds["weights"].values())
    ref_losses = [r["loss"] for r in ref["log"] if "loss" in r]
    assert losses == pytest.approx(ref_losses, abs=0.05)  # bf16 stays near fp32


# ---- 2 processes ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs computed once and shared: the single-process reference and one uninterrupted DeepSpeed run per case
    (stage 2 and 3 save checkpoints every 3 steps and the final model)."""
    cache: dict[str, list[dict]] = {}
    tmp = tmp_path_factory.mktemp("ds")

    def get(name: str) -> list[dict]:
        if name not in cache:
            cfgs = {"single": {**BASE, "bs": 4},
                    "stage1": {**BASE, "strategy": "deepspeed_stage_1", "devices": 2, "rank_seed": 1},
                    "stage2": {**BASE, "strategy": "deepspeed_stage_2", "devices": 2, "rank_seed": 1,
                               "save_steps": 3, "save_model": str(tmp / "stage2_model")},
                    "stage3": {**BASE, "strategy": "deepspeed_stage_3", "devices": 2, "rank_seed": 1,
                               "save_steps": 3, "save_model": str(tmp / "stage3_model")},
                    "stage2_offload": {**BASE, "strategy": "deepspeed_stage_2_offload", "devices": 2,
                                       "rank_seed": 1},
                    "stage3_offload": {**BASE, "strategy": "deepspeed_stage_3_offload", "devices": 2,
                                       "rank_seed": 1},
                    # one process with the same optimizer (DeepSpeedCPUAdam) as the offload runs
                    "single_cpu_adam": {**BASE, "bs": 4, "strategy": "deepspeed_stage_2_offload", "devices": 1},
                    "stage2_ds_optimizer": {**BASE, "strategy": "deepspeed_stage_2", "devices": 2, "args": {
                        "warmup_steps": 2, "deepspeed": {"optimizer": {"type": "auto"},
                                                         "scheduler": {"type": "auto"}}}}}
            cache[name] = run(tmp, cfgs[name], name)
            cache[name][0]["dir"] = tmp
        return cache[name]

    return get


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", ["stage1", "stage2", "stage3", "stage2_ds_optimizer"])
def test_F_STRAT_6_zero_stages_equal_one_process_on_the_big_batch(case, runs):
    """DeepSpeed ZeRO 1/2/3 with 2 x 2 samples and accumulation 3 (a short last window per epoch) == one process
    with 4 samples per micro-batch, within TOL: weights, logged losses, gradient norms and learning rates
    (clipping at 0.5 active). Rank 1 builds its model from another seed: the engine starts every rank from
    rank 0's weights.
    ``stage2_ds_optimizer``: DeepSpeed's own AdamW and WarmupDecayLR from the config's "auto" sections."""
    (ref,), (r0, r1) = runs("single"), runs(case)
    assert (r0["world_size"], r1["rank"]) == (2, 1)
    assert_close(ref["weights"], r0["weights"])
    assert all(torch.equal(v, r1["weights"][k]) for k, v in r0["weights"].items())
    for key in ("loss", "grad_norm", "learning_rate"):
        got, want = [r[key] for r in r0["log"] if key in r], [r[key] for r in ref["log"] if key in r]
        assert len(got) == len(want) == 8 and got == pytest.approx(want, abs=1e-5), key
    assert max(r["grad_norm"] for r in ref["log"] if "grad_norm" in r) > 0.5  # clipping did something
    assert r0["loss"] == pytest.approx(ref["loss"], abs=1e-6)
    if case != "stage1":
        assert r0["engine_optimizer"] in ("DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", ["stage2_offload", "stage3_offload"])
def test_F_STRAT_6_offload_equals_one_process(case, runs):
    """The offload presets (ZeRO-2 with optimizer offload; ZeRO-3 with optimizer and parameter offload) on 2 x 2
    samples with accumulation 3 and active clipping == one process on batches of 4: within TOL against a single
    process that also steps DeepSpeedCPUAdam, within OFFLOAD_TOL against torch's AdamW (see OFFLOAD_TOL). Every
    optimizer step after the first used to fail inside DeepSpeed (the fit loop's ``zero_grad(set_to_none=True)``
    dropped the offloaded fp32 gradient buffers)."""
    (ref,), (cpu_ref,), (r0, r1) = runs("single"), runs("single_cpu_adam"), runs(case)
    assert r0["optimizer_type"] == cpu_ref["optimizer_type"] == "DeepSpeedCPUAdam" and ref["optimizer_type"] == "AdamW"
    assert r0["engine_optimizer"] == ("DeepSpeedZeroOptimizer_Stage3" if case == "stage3_offload"
                                      else "DeepSpeedZeroOptimizer")
    assert (r0["world_size"], r1["rank"], r0["global_step"]) == (2, 1, 8)
    assert all(torch.equal(v, r1["weights"][k]) for k, v in r0["weights"].items())
    assert_close(cpu_ref["weights"], r0["weights"])
    assert_close(ref["weights"], r0["weights"], OFFLOAD_TOL)
    assert max((r0["weights"][k] - v).abs().max() for k, v in r0["initial"].items()) > 0.1  # it trained
    for want_run in (cpu_ref, ref):
        for key in ("loss", "grad_norm", "learning_rate"):
            got, want = [r[key] for r in r0["log"] if key in r], [r[key] for r in want_run["log"] if key in r]
            assert len(got) == len(want) == 8 and got == pytest.approx(want, abs=1e-5), key
        assert r0["loss"] == pytest.approx(want_run["loss"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_F_CKPT_5_sigkill_then_resume_equals_uninterrupted_run(stage, runs, tmp_path):
    """Both ranks are SIGKILLed after step 7 (checkpoints at 3 and 6, the latter mid-epoch); the resumed run
    ends bitwise equal to the uninterrupted one on every rank: weights, optimizer state of the rank's partition,
    logs and training loss."""
    ref = runs(f"stage{stage}")
    cfg = {**BASE, "strategy": f"deepspeed_stage_{stage}", "devices": 2, "rank_seed": 1, "save_steps": 3}
    run(tmp_path, {**cfg, "kill_after_step": 7}, "killed", expect_kill=True)
    manifest = json.loads((tmp_path / "killed" / "checkpoint-6" / "manifest.json").read_text())
    shards = [n for n in manifest["files"] if n.startswith("shards/")]
    assert any("zero_pp_rank_1_" in n for n in shards) and "shards/taskfit_deepspeed.json" in shards
    assert "model.safetensors" not in manifest["files"] and "optimizer.pt" not in manifest["files"]
    assert not (tmp_path / "killed" / "checkpoint-9").exists()
    resumed = run(tmp_path, {**cfg, "out": str(tmp_path / "killed"), "resume": True}, "resumed")
    for want, got in zip(ref, resumed):
        assert got["global_step"] == want["global_step"] == 8
        assert all(torch.equal(v, got["weights"][k]) for k, v in want["weights"].items())
        assert len(want["optimizer"]) > 0 and all(torch.equal(a, b) for a, b in zip(want["optimizer"], got["optimizer"]))
        assert got["log"] == want["log"] and got["loss"] == want["loss"]


def test_F_STRAT_6_more_than_one_optimizer_is_refused_before_any_work(tmp_path):
    """DeepSpeed drives one optimizer per engine: setup refuses two before building anything, naming the limit;
    callers read the capability (max_optimizers, engine_owns_step) instead of testing the class."""
    sys.path.insert(0, str(HERE))
    from ddp_job import Tagger

    strategy = resolve_components(FitArguments(output_dir=str(tmp_path), strategy="deepspeed", report_to="none"))
    assert (strategy.max_optimizers, strategy.engine_owns_step, strategy.shards_parameters) == (1, True, False)
    module = Tagger()
    opts = [torch.optim.SGD(module.net[0].parameters(), lr=0.1), torch.optim.SGD(module.net[2].parameters(), lr=0.1)]
    with pytest.raises(ValueError, match="exactly one optimizer per engine; configure_optimizers returned 2"):
        strategy.setup(module, opts, [], max_steps=4)
    assert strategy.engine is None


@pytest.mark.slow
@pytest.mark.distributed
def test_F_STRAT_6_fit_twice_on_one_fit_equals_a_fresh_fit(tmp_path):
    """A second fit() on the same Fit with new arguments (a trial's learning rate) and a fresh model builds a new
    engine from the new arguments and ends equal to a fresh Fit with those arguments."""
    cfg = {**BASE, "strategy": "deepspeed_stage_2", "devices": 2, "rank_seed": 1}
    twice = run(tmp_path, {**cfg, "second": {"learning_rate": 0.05}}, "twice")
    fresh = run(tmp_path, {**cfg, "args": {**BASE["args"], "learning_rate": 0.05}}, "fresh")
    for got, want in zip(twice, fresh):
        assert_close(want["weights"], got["weights"], 0.0)
        # the rate each step used (HF 5): 0 at the first of 2 warm-up steps, then half of the second fit's 0.05
        assert got["log"] == want["log"] and got["loss"] == want["loss"] and got["lrs"][:2] == pytest.approx([0, 0.025])


@pytest.mark.slow
@pytest.mark.distributed
def test_F_CKPT_5_resume_restores_every_ranks_unlogged_loss_sum(tmp_path):
    """Logging every 2 steps, saving every 3: the checkpoint at step 6 is taken right after a log, the one at step
    3 holds a loss sum per rank that was not logged yet. Killed after step 4, the run resumes from step 3 and logs
    the uninterrupted run's losses and train_loss (each rank gets its own sum back)."""
    cfg = {**BASE, "strategy": "deepspeed_stage_2", "devices": 2, "rank_seed": 1, "save_steps": 3,
           "logging_steps": 2}
    ref = run(tmp_path, cfg, "ref")
    run(tmp_path, {**cfg, "kill_after_step": 4}, "killed", expect_kill=True)
    resumed = run(tmp_path, {**cfg, "out": str(tmp_path / "killed"), "resume": True}, "resumed")
    for want, got in zip(ref, resumed):
        assert got["log"] == want["log"] and got["loss"] == want["loss"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_F_CKPT_5_checkpoint_converts_to_fp32_and_loads_into_a_single_device_model(stage, runs, tmp_path):
    """``taskfit convert checkpoint-8 OUT`` writes model.safetensors with the single-device keys; it loads into a
    fresh single-device model strictly and equals the final DeepSpeed weights exactly and the single-process run
    within TOL. ``save_model`` under DeepSpeed writes the same full weights (gathered under ZeRO-3)."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    from deepspeed_job import Tagger

    (r0, _), (ref,) = runs(f"stage{stage}"), runs("single")
    ckpt = r0["dir"] / f"stage{stage}" / "checkpoint-8"
    proc = subprocess.run([sys.executable, "-m", "taskfit.cli.app", "convert", str(ckpt), str(tmp_path / "conv")],
                          capture_output=True, text=True, timeout=300, env=job_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "conv" / "model.safetensors")
    state = load_file(tmp_path / "conv" / "model.safetensors")
    model = Tagger()
    model.load_state_dict(state, strict=True)
    assert all(v.dtype == torch.float32 for v in state.values())
    assert all(torch.equal(v, r0["weights"][k]) for k, v in model.state_dict().items())
    assert_close(ref["weights"], dict(model.state_dict()))
    saved = load_file(r0["dir"] / f"stage{stage}_model" / "model.safetensors")
    assert sorted(saved) == sorted(ref["weights"]) and all(torch.equal(v, r0["weights"][k]) for k, v in saved.items())
    from taskfit.strategies.deepspeed_convert import deepspeed_fp32_state_dict

    assert all(torch.equal(v, state[k]) for k, v in deepspeed_fp32_state_dict(str(ckpt)).items())
