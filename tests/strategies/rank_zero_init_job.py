"""The job of the meta-device initialisation tests, run in fresh processes: ``python rank_zero_init_job.py
CONFIG.json`` (taskfit re-launches it per rank). In ``configure_model`` rank 0 builds a stack of ``layers``
bias-free ``width x width`` fp32 linear layers from seed 0, the other ranks build it inside ``rank_zero_init`` (the
meta device). At ``on_train_start`` (after the strategy set the model up, before any step) each rank records how
much its peak resident set (``VmHWM``) grew since the model was built, then compares the weights it holds with the seed-0 model;
after ``steps`` training steps it records whether the weights moved. Writes ``{result}.rank{r}.json``."""

from __future__ import annotations

import json
import sys

import torch
from taskfit import Fit, TaskModule
from taskfit.core.rank_zero_init import rank_zero_init
from torch import nn


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``VmHWM`` of ``/proc/self/status``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def full_weights(module: nn.Module) -> list[torch.Tensor]:
    """The module's whole weights on every rank (``full_tensor()`` of a sharded parameter: a collective)."""
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in module.parameters()]


def stack(layers: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))


# kept local: layers built in configure_model, real on rank 0 only, sized to show in the memory
class Stack(TaskModule):
    """Builds its layers in ``configure_model`` (after the processes started: Lightning's hook for big models),
    real on rank 0 and on the meta device elsewhere, and measures the memory from there."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.size = (layers, width)
        self.report: dict = {}

    def configure_model(self) -> None:
        self.report["peak_before_bytes"] = peak_rss_bytes()
        with rank_zero_init() as real:
            self.layers = stack(*self.size)
        self.report.update(built_real=real, model_bytes=sum(p.numel() * p.element_size() for p in self.parameters()))

    def training_step(self, batch, batch_idx):
        x = batch["x"]
        for layer in self.layers:  # small residual steps: the signal reaches every layer of a deep stack
            x = x + layer(x) / 16
        return (x - batch["y"]).pow(2).mean()

    def on_train_start(self) -> None:
        self.report["peak_added_bytes"] = peak_rss_bytes() - self.report["peak_before_bytes"]
        reference = stack(*self.size)  # seed 0: rank 0's weights
        self.report["equal_to_rank0"] = all(torch.equal(a, b) for a, b in zip(full_weights(self), reference.parameters()))
        self.report["start_sum"] = sum(float(w.detach().double().sum()) for w in reference.parameters())


if __name__ == "__main__":
    with open(sys.argv[-1]) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    fit = Fit(output_dir=cfg["out"], max_steps=cfg["steps"], per_device_train_batch_size=2, save_strategy="no",
              disable_tqdm=True, report_to="none", lr_scheduler_type="constant", learning_rate=1e-3,
              strategy=cfg["strategy"], devices=2, **{"ddp_timeout": 300, **cfg.get("options", {})})
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp
    module = Stack(cfg["layers"], cfg["width"])
    g = torch.Generator().manual_seed(1)
    rows = [{"x": torch.randn(cfg["width"], generator=g), "y": torch.randn(cfg["width"], generator=g)}
            for _ in range(8)]
    fit.fit(module, rows)
    module.report["end_sum"] = sum(float(w.detach().double().sum()) for w in full_weights(module))
    with open(f"{cfg['result']}.rank{fit.global_rank}.json", "w") as f:
        json.dump(module.report, f)
