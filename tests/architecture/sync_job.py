"""Counts host syncs per optimizer step in a real run: ``python sync_job.py CONFIG.json`` (taskfit re-launches
it per rank when ``devices`` > 1). Tensor-to-host conversions (``.item()``, ``float()``, ``int()``, ``bool()``,
``.tolist()``, ``.numpy()``) are recorded with the phase they happen in: ``body`` of optimizer step ``s`` (from
its first micro-batch to the end of its optimizer step) or ``after`` step ``s`` (the log / evaluate / save part
that follows it). Writes ``<out>/syncs_<rank>.json``: ``{"body": {s: [callers]}, "after": {s: [callers]},
"logged": [...], "evaluated": [...], "saved": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import FeatureRegression, feature_data  # noqa: E402

from taskfit import Callback, Fit  # noqa: E402

SYNCS = ("item", "__float__", "__bool__", "__int__", "tolist", "numpy")
PHASE = ["setup", 0]
RECORD: dict[str, dict[int, list[str]]] = {"body": defaultdict(list), "after": defaultdict(list),
                                           "setup": defaultdict(list)}


class Phases(Callback):
    """Marks where the loop is: the first micro-batch of step s starts its body; ``on_step_end`` (HF, called
    once per optimizer step before its log / evaluate / save) starts the part after it."""

    def __init__(self) -> None:
        self.logged, self.evaluated, self.saved = set(), set(), set()

    def on_train_batch_start(self, fit, module, batch, batch_idx):
        if PHASE[0] != "body":
            PHASE[:] = ["body", fit.state.global_step + 1]

    def on_step_end(self, args, state, control, **kwargs):
        PHASE[:] = ["after", state.global_step]
        for flag, seen in ((control.should_log, self.logged), (control.should_evaluate, self.evaluated),
                           (control.should_save, self.saved)):
            if flag:
                seen.add(state.global_step)


def instrument() -> None:
    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            stack = traceback.extract_stack(limit=3)
            caller = next((f"{f.filename}:{f.lineno}" for f in reversed(stack[:-1])), "?")
            RECORD[PHASE[0]][PHASE[1]].append(f"{name} {caller}")
            return original(self, *args, **kwargs)
        return wrapper

    for name in SYNCS:
        setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))


class Regression(FeatureRegression):
    train_metric = "mse"  # a tensor: converted only on logging steps


data = feature_data


def main(cfg: dict) -> None:
    phases = Phases()
    fit = Fit(callbacks=[phases], output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=12,
              per_device_train_batch_size=2, per_device_eval_batch_size=4, learning_rate=0.05,
              gradient_accumulation_steps=cfg.get("accum", 1), logging_steps=5, eval_strategy="steps", eval_steps=5,
              save_strategy="steps", save_steps=5, seed=3, devices=cfg.get("devices", 1),
              strategy=cfg.get("strategy", "auto"), ddp_timeout=60)
    instrument()
    fit.fit(Regression(), data(200), data(8))
    rank = int(os.environ.get("RANK", "0"))
    out = {phase: {str(k): v for k, v in per.items()} for phase, per in RECORD.items()}
    out.update(logged=sorted(phases.logged), evaluated=sorted(phases.evaluated), saved=sorted(phases.saved))
    with open(os.path.join(cfg["out"], f"syncs_{rank}.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        main(json.load(fh))
