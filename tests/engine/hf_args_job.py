"""The efficiency guide's shape of script on ``Engine``: ``transformers.TrainingArguments`` built first, above
``engine.launch()``, then a loop with micro-batches from its ``per_device_train_batch_size`` and accumulation over
its ``gradient_accumulation_steps``. Run as ``python hf_args_job.py RESULT_PREFIX training_arguments`` (or
``partial_state``: only Accelerate's ``PartialState``, the part of ``TrainingArguments`` that forms a process group,
without importing transformers); with ``strategy="ddp"`` and ``devices=2`` the Engine re-runs it as rank 1. Each
rank writes ``RESULT_PREFIX.rank{r}.pt``: what it saw above ``launch()`` (a process group? the variables that make
libraries form one? ``RANK``?), its torch thread count after ``launch()``, and its final weights.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from taskfit import Engine

prefix, built_above = sys.argv[1], sys.argv[2]
if built_above == "training_arguments":
    from transformers import TrainingArguments

    training_args = TrainingArguments(output_dir=os.path.dirname(prefix), per_device_train_batch_size=2,
                                      gradient_accumulation_steps=2, report_to="none", log_level="error")
    hf_world_size, batch_size, accumulation = training_args.world_size, 2, training_args.gradient_accumulation_steps
else:  # "partial_state": what TrainingArguments builds (forms a process group when it sees rank variables)
    from accelerate.state import PartialState

    hf_world_size, batch_size, accumulation = PartialState().num_processes, 2, 2
seen_above = {"group": dist.is_available() and dist.is_initialized(),
              "group_variables": sorted(k for k in ("LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE") if k in os.environ),
              "rank": os.environ.get("RANK", "0"),
              "hf_world_size": hf_world_size}

engine = Engine(accelerator="cpu", strategy="ddp", devices=2, ddp_timeout=120)
engine.launch()
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model, optimizer = engine.setup(module, torch.optim.AdamW(module.parameters(), lr=1e-2))
x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
loader = engine.setup_dataloaders(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)),
                                             batch_size=batch_size))
for i, (inputs, target) in enumerate(loader, start=1):
    last = i % accumulation == 0
    with engine.no_backward_sync(model, enabled=not last):
        engine.backward(torch.nn.functional.mse_loss(model(inputs), target) / accumulation)
    if last:
        optimizer.step()
        optimizer.zero_grad()
torch.save({"above_launch": seen_above, "threads": torch.get_num_threads(), "rank": engine.global_rank,
            "world_size": engine.world_size, "rank_variable": os.environ.get("RANK"),
            "weights": {k: v.detach().clone() for k, v in module.state_dict().items()}},
           f"{prefix}.rank{engine.global_rank}.pt")
engine.teardown()
