"""Worker of the distributed evaluation test: a real gloo process group and a minimal test strategy built on
the Strategy API (``reduce``/``all_gather``/``barrier``/``process_dataloader``), standing in for the DDP
strategy of issue #5 until it lands."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist
import torchmetrics
from taskfit import Fit
from taskfit.accelerators.cpu import CPUAccelerator
from taskfit.precision import PRECISIONS
from taskfit.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader, DistributedSampler

from eval_digits_data import DigitClassifier, digits

_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class GlooTestStrategy(SingleDeviceStrategy):
    name = "gloo_test"

    @property
    def global_rank(self) -> int:
        return dist.get_rank()

    @property
    def local_rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    def reduce(self, tensor, op="mean"):
        out = torch.as_tensor(tensor).clone()
        dist.all_reduce(out, op=_OPS[op])
        return out / self.world_size if op == "mean" else out

    def all_gather(self, tensor):
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def barrier(self, name=None):
        dist.barrier()

    def process_dataloader(self, dataloader):
        sampler = DistributedSampler(dataloader.dataset, shuffle=False)
        return DataLoader(dataloader.dataset, batch_size=dataloader.batch_size, sampler=sampler,
                          collate_fn=dataloader.collate_fn)


def accuracy(p) -> dict:
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean()), "n": len(p.label_ids)}


def make_module(weights_path: str) -> DigitClassifier:
    module = DigitClassifier(lambda: torchmetrics.classification.MulticlassAccuracy(num_classes=10, average="micro"))
    module.load_state_dict(torch.load(weights_path, weights_only=True), strict=False)
    return module


def worker(rank: int, world: int, init_file: str, out_dir: str, weights_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        strategy = GlooTestStrategy(CPUAccelerator(), torch.device("cpu"), PRECISIONS.build("32-true"))
        _, ev = digits()
        fit = Fit(strategy=strategy, output_dir=out_dir, logging_dir=os.path.join(out_dir, f"logs-rank{rank}"),
                  report_to="csv", disable_tqdm=True, per_device_eval_batch_size=16, label_names=["digit"],
                  compute_metrics=accuracy)
        module = make_module(weights_path)
        results = {}
        for n in (397, 396):  # 397: the sampler repeats one sample on rank 1; 396: no repeats
            m = fit.evaluate(module, ev[:n])
            pred = fit.predict(module, ev[:n])
            results[f"acc_{n}"], results[f"tm_{n}"] = m["eval_accuracy"], m["eval_tm_accuracy"]
            results[f"n_{n}"], results[f"loss_{n}"] = m["eval_n"], m["eval_loss"]
            results[f"pred_{n}"], results[f"labels_{n}"] = pred.predictions["logits"] if isinstance(
                pred.predictions, dict) else pred.predictions, pred.label_ids
        fit.compute_metrics = None
        fit.args.eval_do_concat_batches = False
        per_batch = fit.predict(module, ev[:397]).predictions
        results["per_batch_rows"] = np.array([len(b) for b in per_batch])
        fit.args.eval_do_concat_batches, fit.args.batch_eval_metrics = True, True
        counts = []

        def per_batch_metrics(p, compute_result):
            counts.append(len(p.label_ids))
            return {"rows": sum(counts)} if compute_result else {}

        fit.compute_metrics = per_batch_metrics
        results["batch_metric_rows"] = fit.evaluate(module, ev[:397])["eval_rows"]
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    finally:
        dist.destroy_process_group()
