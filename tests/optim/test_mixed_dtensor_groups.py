"""F-SCALE-1 / F-LOOP-4: ``create_optimizer`` on a model whose parameters mix ``DTensor``s (a tensor-parallel
layer) and plain tensors (an embedding, a head), as ``ModelParallelStrategy`` with one data-parallel group leaves
them. The multi-tensor kernels (``adamw_torch_fused``, the default ``optim``; ``foreach=True``) refused such a
group (``aten._fused_adamw_.default got mixed torch.Tensor and DTensor``); each group is now split by tensor kind
with the same hyperparameters when the optimizer runs such a kernel, and the step equals the unfused one on
plain tensors.

The check runs in a fresh process (a 1-process gloo group and a 1-device mesh), so no process group leaks into
the rest of the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from types import SimpleNamespace

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from taskfit.optim.optimizers import create_optimizer

def model(tp):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 8), nn.LayerNorm(8),
                      nn.Linear(8, 11))
    if tp:
        mesh = init_device_mesh("cpu", (1,))
        parallelize_module(m, mesh, {"1": ColwiseParallel(), "3": RowwiseParallel()})
    return m

def train(m, optim, optim_args=None):
    args = SimpleNamespace(optim=optim, optim_args=optim_args, learning_rate=0.05, weight_decay=0.1,
                           adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    opt = create_optimizer(m, args)
    ids = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten()).backward()
        opt.step()
    full = lambda p: p.full_tensor() if isinstance(p, DTensor) else p
    names = {id(p): n for n, p in m.named_parameters()}
    groups = [{"names": [names[id(p)] for p in g["params"]],
               "kinds": sorted({type(p).__name__ for p in g["params"]}),
               "hyper": {k: v for k, v in g.items() if k in ("lr", "weight_decay", "betas", "eps", "fused", "foreach")}}
              for g in opt.param_groups]
    return {n: full(p).detach() for n, p in m.named_parameters()}, groups

ref, ref_groups = train(model(False), "adamw_torch")
result = {"ref_groups": ref_groups}
for optim, optim_args in [("adamw_torch_fused", None), ("adamw_torch", "foreach=True"), ("sgd", "foreach=True"),
                          ("adamw_torch", None)]:
    key = f"{optim}:{optim_args}"
    try:
        got, groups = train(model(True), optim, optim_args)
    except Exception as err:
        result[key] = {"error": f"{type(err).__name__}: {err}"[:300]}
        continue
    base = ref if optim.startswith("adamw") else train(model(False), optim, optim_args)[0]
    result[key] = {"groups": groups, "diff": max((got[n] - base[n]).abs().max().item() for n in base)}
print("RESULT" + json.dumps(result, default=str))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def result():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = str(29500 + os.getpid() % 2000)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, port], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("key", ["adamw_torch_fused:None", "adamw_torch:foreach=True", "sgd:foreach=True",
                                 "adamw_torch:None"])
def test_F_SCALE_1_mixed_dtensor_and_plain_parameters_step_with_every_kernel(result, key):
    """The fused / foreach / default kernels step a model with DTensor and plain parameters, and end equal (within
    1e-6) to the same model without tensor parallelism (AdamW: the unfused AdamW on plain tensors)."""
    got = result[key]
    assert "error" not in got, got
    assert got["diff"] < 1e-6


def test_F_SCALE_1_groups_are_split_by_kind_keeping_the_decay_layout(result):
    """Each group holds one kind of tensor; a mixed group is split into sub-groups with its hyperparameters
    (the decay sub-groups first, then the no-decay ones), and together they hold HF's decay / no-decay names."""
    groups = result["adamw_torch_fused:None"]["groups"]
    assert all(len(g["kinds"]) == 1 for g in groups)
    assert [g["hyper"]["weight_decay"] for g in groups] == [0.1, 0.1, 0.0, 0.0]
    assert all(g["hyper"]["fused"] is True and g["hyper"]["lr"] == 0.05 for g in groups)
    decay = {n for g in groups if g["hyper"]["weight_decay"] == 0.1 for n in g["names"]}
    no_decay = {n for g in groups if g["hyper"]["weight_decay"] == 0.0 for n in g["names"]}
    loop = result["adamw_torch:None"]["groups"]  # the per-parameter loop (CPU default) takes mixed groups
    assert [g["hyper"]["weight_decay"] for g in loop] == [0.1, 0.0]  # its checkpoints keep their layout
    ref = result["ref_groups"]
    assert len(ref) == 2  # without DTensors the layout is HF's two groups, unchanged
    assert decay == set(ref[0]["names"]) and no_decay == set(ref[1]["names"])
    assert decay == {"0.weight", "1.weight", "3.weight", "5.weight"}
