"""Job of the DDP override test: ``python overrides_ddp_job.py MODE OUT [STRATEGY]`` trains an HF-style subclass of
``taskfit.hf.Trainer`` on 2 gloo processes (taskfit re-launches the script per rank) and writes, per rank, the
calls its override points recorded and the trained weights to ``OUT/rank{r}.json``.

MODE ``override``: get_train_dataloader, create_optimizer (SGD lr 0.01), training_step (loss x 3, own backward)
and evaluate (an extra metric) are overridden. MODE ``reference``: only create_optimizer, with SGD lr 0.03 - the
same updates as the x 3 loss, so equal weights prove the training_step override ran in the workers."""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RegressionDataset  # noqa: E402

import taskfit.hf as m  # noqa: E402


class LinearRegression(nn.Module):
    """``y = w x + b`` as an ``nn.Linear`` (FSDP shards no 0-dim parameters), returning ``(loss, y)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        nn.init.zeros_(self.lin.weight), nn.init.zeros_(self.lin.bias)

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None):
        y = self.lin(input_x[:, None]).squeeze(-1)
        return (y,) if labels is None else (nn.functional.mse_loss(y, labels), y)


def main(mode: str, out: str, strategy: str = "ddp") -> None:
    calls: list = []

    class Sub(m.Trainer):
        def create_optimizer(self, model=None):
            calls.append(["create_optimizer", self.optimizer is None])
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01 if mode == "override" else 0.03)
            return self.optimizer

        if mode == "override":
            def get_train_dataloader(self):
                loader = super().get_train_dataloader()
                calls.append(["get_train_dataloader", len(loader)])  # this rank's share: 32 / 2 / 4 = 4 batches
                return loader

            def training_step(self, model, inputs, num_items_in_batch=None):
                calls.append(["training_step", int(inputs["labels"].shape[0])])
                model.train()
                loss = 3.0 * self.compute_loss(model, inputs)
                loss.backward()  # through the DDP wrapper's forward: the gradients are averaged over the ranks
                return loss.detach()

            def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
                metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
                calls.append(["evaluate", sorted(k for k in metrics if not k.endswith(("_runtime", "_second")))])
                return metrics

    m.set_seed(42)
    args = m.TrainingArguments(output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                               num_train_epochs=1, logging_steps=2, eval_strategy="steps", eval_steps=2,
                               report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=42,
                               lr_scheduler_type="constant", max_grad_norm=0.0)  # no clipping: x 3 shows
    t = Sub(model=LinearRegression(), args=args, train_dataset=RegressionDataset(length=32),
            eval_dataset=RegressionDataset(length=16, seed=1), strategy=strategy, devices=2)
    t.train()
    weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).tolist()  # FSDP: the whole tensor
               for k, v in t.model.state_dict().items()}
    with open(os.path.join(out, f"rank{t.global_rank}.json"), "w") as f:
        json.dump({"calls": calls, "weights": weights, "world_size": t.world_size,
                   "log_history": t.state.log_history}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
