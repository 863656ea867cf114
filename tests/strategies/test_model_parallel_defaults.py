"""F-SCALE-1 with the options users get: the tensor-parallel module of docs/strategies.md on 2 real gloo processes
(mesh 1 x 2), nothing set but ``output_dir``, ``max_steps``, ``strategy`` and ``devices``. The default ``optim``
(``adamw_torch_fused``) stepped a group that mixed the split blocks (``DTensor``) with the embedding and head
(plain tensors, one data-parallel group) and stopped: ``aten._fused_adamw_.default got mixed torch.Tensor and
DTensor``. Both forms of the strategy now train and end equal to one process with the same defaults."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mp_helpers import max_diff, run_job

TOL = 1e-5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, default options (the module leaves itself whole without a mesh)."""
    import tp_default_job

    return tp_default_job.run({"out": str(tmp_path_factory.mktemp("ref") / "ref"), "strategy": "auto"})


@pytest.mark.distributed
@pytest.mark.parametrize("form", ["object", "model_parallel"])
def test_F_SCALE_1_tensor_parallel_with_default_options_trains_and_equals_one_process(form, tmp_path, reference):
    """F-SCALE-1: ``ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)`` / ``strategy="model_parallel"`` with ``devices=2`` and the
    default fused AdamW: the blocks are DTensors beside plain embedding/head, every optimizer group holds one
    kind, and the final weights and training loss equal one process's within 1e-5 (and moved from the start)."""
    got = run_job(tmp_path, form, script="tp_default_job.py", strategy=form, devices=2)
    assert got["world_size"] == 2
    assert got["optim"]["name"] == reference["optim"]["name"] == "adamw_torch_fused"
    assert got["param_types"]["blocks.0.up.weight"] == "DTensor" and got["param_types"]["embed.weight"] != "DTensor"
    groups = got["optim"]["groups"]
    assert all(len(g["kinds"]) == 1 and g["fused"] is True for g in groups)
    assert sorted({g["weight_decay"] for g in groups}) == sorted({g["weight_decay"] for g in
                                                                  reference["optim"]["groups"]})
    assert max_diff(got["weights"], reference["weights"]) < TOL
    assert got["loss"] == pytest.approx(reference["loss"], abs=TOL)
    moved = max((got["weights"][k] - reference["initial"][k]).abs().max().item() for k in got["weights"])
    assert moved > 1e-5  # it trained
