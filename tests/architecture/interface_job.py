"""A real run with every Strategy and Accelerator interface method instrumented: ``python interface_job.py
CONFIG.json`` (taskfit re-launches it per rank when ``devices`` > 1). Each process writes the names of the methods
that were called to ``<out>/calls_<rank>.json``.

The run trains with evaluation, gradient clipping, a checkpoint, device-stats and throughput callbacks, then
resumes from the checkpoint in a second ``Fit`` and predicts, so every part of the contract has a reason to run.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobs_common import FeatureRegression, feature_data  # noqa: E402

from taskfit import Fit  # noqa: E402
from taskfit.accelerators.accelerator import Accelerator  # noqa: E402
from taskfit.callbacks.device_stats import DeviceStatsMonitor  # noqa: E402
from taskfit.callbacks.throughput import ThroughputMonitor  # noqa: E402
from taskfit.strategies.strategy import Strategy  # noqa: E402

CALLS: set[str] = set()


def public_methods(base: type) -> list[str]:
    """The interface: public callables defined on ``base`` (properties and class attributes, classes such as
    ``Strategy.settings_type`` included, excluded)."""
    out = []
    for name, value in vars(base).items():
        if name.startswith("_") or isinstance(value, (property, type)):
            continue
        if callable(value) or isinstance(value, (staticmethod, classmethod)):
            out.append(name)
    return sorted(out)


def _wrap(cls: type, name: str, label: str) -> None:
    raw = vars(cls)[name]
    if isinstance(raw, staticmethod):
        fn = raw.__func__

        @functools.wraps(fn)
        def static(*a, **k):
            CALLS.add(label)
            return fn(*a, **k)

        setattr(cls, name, staticmethod(static))
    elif isinstance(raw, classmethod):
        fn = raw.__func__

        @functools.wraps(fn)
        def cm(c, *a, **k):
            CALLS.add(label)
            return fn(c, *a, **k)

        setattr(cls, name, classmethod(cm))
    elif inspect.isfunction(raw):
        @functools.wraps(raw)
        def method(*a, **k):
            CALLS.add(label)
            return raw(*a, **k)

        setattr(cls, name, method)


def _subclasses(base: type) -> list[type]:
    out, todo = [], [base]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


def instrument() -> None:
    """Wrap each interface method on the base class and on every subclass that overrides it."""
    import taskfit.accelerators  # noqa: F401  (registers every accelerator class)
    import taskfit.strategies  # noqa: F401

    for base, prefix in ((Strategy, "Strategy"), (Accelerator, "Accelerator")):
        for name in public_methods(base):
            for cls in _subclasses(base):
                if name in vars(cls):
                    _wrap(cls, name, f"{prefix}.{name}")


class Regression(FeatureRegression):
    val_metric = "val_mse"


def data(n: int = 32) -> list[dict[str, torch.Tensor]]:
    return feature_data(n)


def main(cfg: dict) -> None:
    instrument()
    args = dict(output_dir=cfg["out"], report_to="none", disable_tqdm=True, max_steps=4, per_device_train_batch_size=4,
                per_device_eval_batch_size=4, learning_rate=0.05, max_grad_norm=1.0, logging_steps=2,
                eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, skip_memory_metrics=False,
                seed=3, devices=cfg.get("devices", "auto"), strategy=cfg.get("strategy", "auto"), ddp_timeout=60,
                precision="16-mixed")
    fit = Fit(callbacks=[DeviceStatsMonitor(), ThroughputMonitor()], **args)
    fit.fit(Regression(), data(), data(8))
    # the resumed run clips by value (clip_gradients_value), the first by norm (clip_gradients)
    again = Fit(**{**args, "max_steps": 6, "bf16_full_eval": True, "gradient_clip_algorithm": "value"})
    again.fit(Regression(), data(), data(8), resume_from_checkpoint=True)
    again.predict(data=data(8))
    again.validate()  # bf16_full_eval: the strategy switches its precision for a stand-alone evaluation
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(cfg["out"], f"calls_{rank}.json"), "w") as f:
        json.dump(sorted(CALLS), f)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        main(json.load(fh))
