"""Job of the multi-process override tests: ``python overrides_all_job.py MODE OUT STRATEGY DEVICES`` trains an
HF-style subclass of ``taskfit.hf.Trainer`` (taskfit re-launches the script per rank) and writes, per rank, the calls
its override points recorded, the trained weights and the log history to ``OUT/rank{r}.json``.

MODE ``override``: every HF override point is overridden (each records its call and defers to ``super()``, except
``create_optimizer`` (SGD lr 0.01) and ``create_scheduler`` (a constant ``LambdaLR``)); ``training_step`` moves the
labels up by 1 before the default step, ``log`` adds a ``calls`` entry to every row. ``predict`` runs after
training. MODE ``reference``: only ``create_optimizer`` and ``create_scheduler``, with a collator that moves the
labels up by 1: the same updates, so equal weights prove that the ``training_step`` override ran in the workers
(its backward is the default one: HF's ``accelerator.backward``, the DeepSpeed engine's under DeepSpeed).
MODES ``ds_optimizer`` / ``ds_optimizer_own``: a DeepSpeed config with an ``optimizer`` section; ``create_optimizer``
and ``create_scheduler`` overrides that defer to ``super()`` (they find HF's placeholders) or that build their own
(refused before training, as HF's accelerate refuses it)."""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RegressionDataset  # noqa: E402
from overrides_ddp_job import LinearRegression  # noqa: E402

import taskfit.hf as m  # noqa: E402
from taskfit.data.loaders import default_collate_with_labels  # noqa: E402


def shifted(samples):
    """The default collator, labels + 1 (the reference run's stand-in for the training_step override)."""
    batch = default_collate_with_labels(samples)
    return {**batch, "labels": batch["labels"] + 1.0}


def subclass(mode: str, calls: list, names: object = m) -> type:
    """The Trainer subclass of ``mode`` whose overrides append to ``calls`` (``names``: ``taskfit.hf``, or
    ``transformers`` for the single-process oracle run)."""
    methods: dict = {}

    def create_optimizer(self, model=None):
        calls.append(["create_optimizer", repr(self.optimizer)])
        if mode == "ds_optimizer":
            return super(cls, self).create_optimizer(model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        return self.optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        calls.append(["create_scheduler", num_training_steps, repr(self.lr_scheduler)])
        if mode == "ds_optimizer":
            return super(cls, self).create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lambda step: 1.0)
        return self.lr_scheduler

    methods.update(create_optimizer=create_optimizer, create_scheduler=create_scheduler)
    if mode == "override":
        def create_optimizer_and_scheduler(self, num_training_steps):
            calls.append(["create_optimizer_and_scheduler", num_training_steps])  # HF 5's train() never calls it
            return super(cls, self).create_optimizer_and_scheduler(num_training_steps)

        def get_train_dataloader(self):
            loader = super(cls, self).get_train_dataloader()
            calls.append(["get_train_dataloader", len(loader)])  # this rank's share
            return loader

        def get_eval_dataloader(self, eval_dataset=None):
            loader = super(cls, self).get_eval_dataloader(eval_dataset)
            calls.append(["get_eval_dataloader", len(loader)])
            return loader

        def get_test_dataloader(self, test_dataset):
            loader = super(cls, self).get_test_dataloader(test_dataset)
            calls.append(["get_test_dataloader", len(loader)])
            return loader

        def training_step(self, model, inputs, num_items_in_batch=None):
            calls.append(["training_step", int(inputs["labels"].shape[0])])
            inputs = {**inputs, "labels": inputs["labels"] + 1.0}
            return super(cls, self).training_step(model, inputs, num_items_in_batch)

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            calls.append(["prediction_step", int(inputs["input_x"].shape[0]), prediction_loss_only])
            return super(cls, self).prediction_step(model, inputs, prediction_loss_only, ignore_keys)

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            metrics = super(cls, self).evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            calls.append(["evaluate", sorted(k for k in metrics if not k.endswith(("_runtime", "_second")))])
            return metrics

        def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
            out = super(cls, self).predict(test_dataset, ignore_keys, metric_key_prefix)
            calls.append(["predict", list(out.predictions.shape)])
            return out

        def log(self, logs, start_time=None):
            calls.append(["log", sorted(k for k in logs if not k.endswith(("_runtime", "_second", "flos")))])
            return super(cls, self).log({**logs, "calls": len(calls)}, start_time)

        methods.update({f.__name__: f for f in (
            create_optimizer_and_scheduler, get_train_dataloader, get_eval_dataloader, get_test_dataloader,
            training_step, prediction_step, evaluate, predict, log)})
    cls = type("Sub", (names.Trainer,), methods)
    return cls


def main(mode: str, out: str, strategy: str, devices: str) -> None:
    calls: list = []
    m.set_seed(42)
    extra = {}
    if mode.startswith("ds_optimizer"):
        extra["deepspeed"] = {"optimizer": {"type": "auto"}, "zero_optimization": {"stage": 2}}
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                               num_train_epochs=1, logging_steps=2, eval_strategy="steps", eval_steps=2,
                               report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=42,
                               learning_rate=0.01, lr_scheduler_type="constant", max_grad_norm=0.0, **extra)
    t = subclass(mode, calls)(model=LinearRegression(), args=args, train_dataset=RegressionDataset(length=32),
                              eval_dataset=RegressionDataset(length=16, seed=1), strategy=strategy,
                              devices=int(devices), data_collator=shifted if mode == "reference" else None)
    error = None
    try:
        t.train()
        if mode == "override":
            t.predict(RegressionDataset(length=8, seed=2))
    except ValueError as err:  # ds_optimizer_own: refused before any work
        error = str(err)
    weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).tolist()
               for k, v in t.model.state_dict().items()}
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"calls": calls, "weights": weights, "world_size": t.world_size, "error": error,
                   "optimizer": type(t.optimizer).__name__ if error is None else None,
                   "log_history": [{k: v for k, v in r.items() if not k.endswith(("_runtime", "_second"))}
                                   for r in t.state.log_history]}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
