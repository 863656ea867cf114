"""F-SCALE-1: ``ModelParallelStrategy`` (data x tensor parallelism on a ``DeviceMesh``), against one process on
the same global batch, with real gloo processes on the CPU. The model (``mp_job.py``): embedding -> 2 blocks of
column-wise ``up`` / row-wise ``down`` Linear layers -> head. Multi-process cases are ``distributed`` and ``slow``
(``make test-dist``) except one quick 2-process tensor-parallel equivalence."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mp_helpers import TOL, losses, max_diff, norms, optim_diff, run_job  # noqa: E402

STEPS = 4


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, global batch 4, clipping at 1.0 (engaged: the norms are above it), run in this process."""
    import mp_job

    tmp = tmp_path_factory.mktemp("single")
    cfg = {"out": str(tmp / "single"), "bs": 4, "steps": STEPS}
    return mp_job.run(cfg)


def _check_equal(got: dict, ref: dict, world: int, mesh: tuple[int, int]) -> None:
    assert got["strategy"] == "ModelParallelStrategy" and got["world_size"] == world
    assert got["mesh"] == mesh and got["mesh_names"] == ("data_parallel", "tensor_parallel")
    assert got["module_mesh"]  # module.device_mesh is fit.device_mesh
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert optim_diff(got["optim"], ref["optim"]) < TOL
    assert losses(got) == pytest.approx(losses(ref), abs=2e-6)
    assert norms(got) == pytest.approx(norms(ref), abs=TOL)
    assert max(norms(got)) > 1.0  # clipping engaged: the global norm over the shards was computed


@pytest.mark.distributed
def test_F_SCALE_1_tensor_parallel_two_processes_equal_one_process(tmp_path, single):
    """F-SCALE-1: TP alone (mesh 1 x 2, configure_model applies ColwiseParallel/RowwiseParallel): the block
    weights are DTensors, both processes read the same batches, and weights, AdamW state, losses and clipped
    gradient norms equal one process's within 1e-5."""
    got = run_job(tmp_path, "tp2", bs=4, mesh=[1, 2], devices=2, steps=STEPS)
    _check_equal(got, single, 2, (1, 2))
    types = got["param_types"]
    assert types["lm.blocks.0.up.weight"] == "DTensor" and types["lm.blocks.1.down.weight"] == "DTensor"
    assert types["lm.embed.weight"] == "Parameter"  # outside the plan: replicated plain tensors


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("plan", [False, True], ids=["configure_model", "tp_plan"])
def test_F_SCALE_1_fsdp_x_tp_2x2_mesh_equals_one_process(plan, tmp_path, single):
    """F-SCALE-1: a 2 x 2 mesh (4 processes: FSDP over data_parallel x TP over tensor_parallel), batch 2 per
    data-parallel rank, equals one process with batch 4 within 1e-5 over 4 clipped steps. ``configure_model``:
    the module shards itself; ``tp_plan``: the module does not override configure_model and the strategy applies
    the model's ``tp_plan`` and shards the rest over the data-parallel mesh."""
    got = run_job(tmp_path, "mesh", bs=2, mesh=[2, 2], devices=4, steps=STEPS, plan=plan)
    _check_equal(got, single, 4, (2, 2))
    assert set(got["param_types"].values()) == {"DTensor"}  # every parameter sharded on the mesh


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_1_dp_x_tp_with_gradient_accumulation_equals_one_process(tmp_path, single):
    """F-SCALE-1: mesh 2 x 2 with 2-step accumulation and batch 1 (2 x 1 x 2 = 4 samples per step) equals one
    process with batch 4."""
    got = run_job(tmp_path, "accum", bs=1, accum=2, mesh=[2, 2], devices=4, steps=STEPS)
    _check_equal(got, single, 4, (2, 2))


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_1_sigkill_then_resume_under_the_mesh_equals_the_uninterrupted_run(tmp_path):
    """F-SCALE-1: a 2 x 2 mesh run checkpoints (DCP shards, one file per rank) every 3 steps and is SIGKILLed
    after step 5; the resumed run (mid-epoch, same mesh) ends bit-equal to the uninterrupted one."""
    args = {"save_strategy": "steps", "save_steps": 3}
    cfg = dict(bs=2, mesh=[2, 2], devices=4, steps=7, args=args)
    ref = run_job(tmp_path, "ref", **cfg)
    run_job(tmp_path, "run", kill=5, expect_kill=True, **cfg)
    ckpt = tmp_path / "run" / "checkpoint-3"
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert {f"shards/__{r}_0.distcp" for r in range(4)} | {"shards/.metadata"} <= set(files)
    assert "model.safetensors" not in files
    resumed = run_job(tmp_path, "run", resume=True, **cfg)
    assert max_diff(resumed["weights"], ref["weights"]) == 0.0
    assert optim_diff(resumed["optim"], ref["optim"]) == 0.0
    assert losses(resumed) == losses(ref)[-len(losses(resumed)):]


# -- errors before any work (one process) ------------------------------------------------------------------------
def _fit(**kw):
    from taskfit import Fit

    return Fit(output_dir="unused", report_to="none", disable_tqdm=True, **kw)


def test_F_SCALE_1_sizes_that_do_not_multiply_to_the_world_size_fail_at_construction():
    from taskfit.strategies import ModelParallelStrategy

    with pytest.raises(ValueError, match=r"data_parallel_size=3 x tensor_parallel_size=1 does not multiply to the "
                                         r"world size 2"):
        _fit(strategy=ModelParallelStrategy(data_parallel_size=3, tensor_parallel_size=1), devices=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=0 is not valid"):
        ModelParallelStrategy(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="context_parallel_size=2 is not supported"):
        ModelParallelStrategy(context_parallel_size=2)


@pytest.mark.parametrize("precision", ["16-mixed", "64-true"])
def test_F_SCALE_1_unsupported_precision_fails_naming_the_supported_ones(precision):
    with pytest.raises(ValueError, match=rf"does not support precision='{precision}'; choose one of \['32-true', "
                                         r"'bf16-mixed', 'bf16-true', '16-true'\]"):
        _fit(strategy="model_parallel", precision=precision)


def test_F_SCALE_1_object_form_takes_fit_s_devices_and_precision():
    from taskfit.strategies import ModelParallelStrategy

    fit = _fit(strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2), devices=2,
               precision="bf16-mixed")
    s = fit.strategy
    assert type(s) is ModelParallelStrategy and s.world_size == 2 and s.precision.name == "bf16-mixed"
    assert s.mesh_shape() == (1, 2) and s.data_parallel_size == 1
    assert _fit(strategy="model_parallel", devices=2).strategy.mesh_shape() == (1, 2)  # Lightning's "auto"


def test_F_SCALE_1_module_without_configure_model_or_tp_plan_fails_before_training(tmp_path):
    from helpers.models import Regression, regression_data

    fit = _fit(strategy="model_parallel", max_steps=1)
    with pytest.raises(ValueError, match="needs Regression to override configure_model\\(\\).*tp_plan"):
        fit.fit(Regression(features=2, seed=None), regression_data(4, features=2))
    assert fit.strategy.device_mesh is None  # refused before the process group and the mesh


def _twin_parameters() -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """Two lists of equal plain parameters with equal gradients (one for the helper, one for torch)."""
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(3)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    return a, b


def test_F_SCALE_1_clip_grad_norm_over_mixed_dtensor_and_plain_gradients_matches_torch():
    """The norm helper on plain tensors alone equals ``clip_grad_norm_`` (the DTensor cases run in the
    multi-process tests above)."""
    from taskfit.strategies.tp_clip import clip_grad_norm

    a, b = _twin_parameters()
    assert clip_grad_norm(a, 1.0) == pytest.approx(torch.nn.utils.clip_grad_norm_(b, 1.0).item(), rel=1e-6)
    assert all(torch.allclose(p.grad, q.grad, atol=1e-7) for p, q in zip(a, b))


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_1_hf_model_tp_plan_applied_on_two_processes_equals_one_process(tmp_path):
    """F-SCALE-1: a plain HF ``LlamaForCausalLM`` (tiny, random, no download) given to ``Fit`` under
    ``model_parallel`` with 2 processes: the strategy applies the model's own ``tp_plan`` (``colwise`` /
    ``rowwise`` projections, ``embedding_rowwise``, ``colwise_gather_output`` head) and training equals one
    process within 1e-5."""
    ref = run_job(tmp_path, "hf_single", bs=4, hf=True, steps=STEPS)
    got = run_job(tmp_path, "hf_tp2", bs=4, hf=True, mesh=[1, 2], devices=2, steps=STEPS)
    assert got["mesh"] == (1, 2)
    types = got["param_types"]
    assert types["model.layers.0.self_attn.q_proj.weight"] == "DTensor" and types["lm_head.weight"] == "DTensor"
    assert types["model.norm.weight"] == "Parameter"
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert optim_diff(got["optim"], ref["optim"]) < TOL
    assert losses(got) == pytest.approx(losses(ref), abs=2e-6)


def test_F_SCALE_1_unknown_tp_plan_style_fails_before_the_mesh():
    from helpers.models import Regression
    from taskfit.strategies import STRATEGIES  # noqa: F401 (registry import)
    from taskfit.strategies.model_parallel import ModelParallelStrategy

    planned = Regression(features=2, seed=None)
    planned.layer.tp_plan = {"": "packed_colwise"}  # a plan on a child, as HF models carry one
    s = _fit(strategy="model_parallel").strategy
    assert isinstance(s, ModelParallelStrategy)
    with pytest.raises(ValueError, match="'packed_colwise' is not a style taskfit applies; use one of"):
        s.check_module(planned)


# -- clipping by value ---------------------------------------------------------------------------------------
VALUE = {"gradient_clip_algorithm": "value"}


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_1_clip_by_value_tensor_parallel_two_processes_equal_one_process(tmp_path):
    """F-SCALE-1: ``gradient_clip_algorithm="value"`` (each gradient element to [-0.01, 0.01]) under 2-process
    tensor parallelism, where the block gradients are DTensor shards and the embedding/head ones plain tensors,
    equals one process on the same global batch within 1e-5 (weights, AdamW state, losses); the clamp engaged (the
    one-process run without it ends elsewhere)."""
    import mp_job

    ref = mp_job.run({"out": str(tmp_path / "ref"), "bs": 4, "steps": STEPS, "max_grad_norm": 0.01, "args": VALUE})
    free = mp_job.run({"out": str(tmp_path / "free"), "bs": 4, "steps": STEPS, "max_grad_norm": 0.0})
    assert max_diff(ref["weights"], free["weights"]) > 1e-3  # the clamp changed the trajectory
    got = run_job(tmp_path, "tp2_value", bs=4, mesh=[1, 2], devices=2, steps=STEPS, max_grad_norm=0.01, args=VALUE)
    assert got["param_types"]["lm.blocks.0.up.weight"] == "DTensor"
    assert got["param_types"]["lm.embed.weight"] == "Parameter"
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert optim_diff(got["optim"], ref["optim"]) < TOL
    assert losses(got) == pytest.approx(losses(ref), abs=2e-6)


@pytest.mark.distributed
@pytest.mark.slow
def test_F_SCALE_1_clip_helpers_on_every_dtensor_placement_equal_torch_on_the_full_gradients(tmp_path):
    """F-SCALE-1: ``clip_grad_value`` and ``clip_grad_norm`` on 2 processes, over gradients placed ``Shard(0)``,
    ``Shard(1)``, ``Replicate``, ``Partial`` (a pending sum: reduced before the clamp) and plain, equal torch's
    ``clip_grad_value_`` / ``clip_grad_norm_`` on the full gradients in one process."""
    import subprocess

    out = tmp_path / "clip.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": HERE}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "tp_clip_job.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(str(out))
    for mode in ("value", "norm"):
        r = results[mode]
        assert "Partial(sum)" in r["placements"][3] or "Replicate" in r["placements"][3]
        for got, ref in zip(r["got"], r["ref"]):
            assert torch.allclose(got, ref, atol=1e-6), mode
    assert results["value"]["ref"][0].abs().max() == pytest.approx(0.3)  # the bound engaged
    assert results["norm"]["norm"] == pytest.approx(results["norm"]["ref_norm"], rel=1e-6)


def test_F_SCALE_1_clip_grad_value_on_plain_tensors_matches_torch():
    """The value helper on plain tensors alone equals ``clip_grad_value_`` exactly."""
    from taskfit.strategies.tp_clip import clip_grad_value

    a, b = _twin_parameters()
    clip_grad_value(a, 0.5)
    torch.nn.utils.clip_grad_value_(b, 0.5)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a, b))


# -- the own loop (Engine) ---------------------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("how", ["own_code", "parallelize_fn"])
def test_F_SCALE_1_engine_mesh_after_launch_and_user_parallelize_equal_one_process(how, tmp_path):
    """F-SCALE-1 / F-ENGINE-2: under ``Engine(strategy=ModelParallelStrategy(1, 2))`` the mesh exists right after
    ``engine.launch()`` (``engine.device_mesh`` is ``engine.strategy.device_mesh``, Lightning Fabric's
    ``fabric.strategy.device_mesh``), so the loop parallelises the model itself before ``engine.setup`` (or hands
    ``parallelize_fn`` to the strategy, Fabric's form); 4 clipped AdamW steps on 2 processes equal the plain loop
    in one process within 1e-5 (weights, losses, gradient norms), and the value clamp too."""
    ref = run_job(tmp_path, "ref", script="mp_engine_job.py", tp=1, bs=4, steps=STEPS)
    got = run_job(tmp_path, how, script="mp_engine_job.py", tp=2, how=how, bs=4, steps=STEPS)
    assert got["mesh"] == (1, 2) and got["mesh_names"] == ("data_parallel", "tensor_parallel")
    assert got["strategy_mesh"]
    assert got["param_types"]["blocks.0.up.weight"] == "DTensor" and got["param_types"]["head.weight"] == "Parameter"
    assert max_diff(got["weights"], ref["weights"]) < TOL
    assert got["losses"] == pytest.approx(ref["losses"], abs=2e-6)
    assert got["norms"] == pytest.approx(ref["norms"], abs=TOL) and max(ref["norms"]) > 1.0
    if how == "own_code":
        ref_v = run_job(tmp_path, "ref_v", script="mp_engine_job.py", tp=1, bs=4, steps=STEPS, clip="value")
        got_v = run_job(tmp_path, "tp_v", script="mp_engine_job.py", tp=2, bs=4, steps=STEPS, clip="value")
        assert max_diff(got_v["weights"], ref_v["weights"]) < TOL
        assert max_diff(got_v["weights"], ref["weights"]) > 1e-3  # the clamp engaged


def test_F_SCALE_1_engine_module_neither_parallelised_nor_planned_is_refused():
    """A plain module under ``model_parallel`` with no ``configure_model``, no DTensor parameters, no
    ``parallelize_fn`` and no ``tp_plan`` is refused, naming the ways to parallelise it; one with DTensor-free
    parameters but a ``parallelize_fn`` is accepted."""
    from torch import nn

    from taskfit.strategies import ModelParallelStrategy

    s = _fit(strategy="model_parallel").strategy
    with pytest.raises(ValueError, match=r"needs Linear to override configure_model\(\).*engine.device_mesh.*"
                                         r"parallelize_fn"):
        s.check_module(nn.Linear(2, 2))
    assert s.parallelizer(nn.Linear(2, 2)) == "tp_plan"
    s.parallelize_fn = lambda module, mesh: module
    assert s.parallelizer(nn.Linear(2, 2)) == "parallelize_fn"
    s.check_module(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="parallelize_fn must be a function"):
        ModelParallelStrategy(parallelize_fn=3)
