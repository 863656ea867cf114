"""Shared pieces of the differential suite: tiny in-memory models and datasets in the shape of HF's own trainer
tests (``RegressionModel`` / ``RegressionDataset``), and a runner that executes one scenario under
``transformers`` and under ``taskfit.hf`` with only the import changed."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch
from torch import nn


class RegressionDataset(torch.utils.data.Dataset):
    """y = a * x + b + noise, as HF's ``RegressionDataset`` (items are dicts with ``input_x`` and ``labels``)."""

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int = 42,
                 label_name: str = "labels") -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)
        self.label_name = label_name

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_x": self.x[i], self.label_name: self.y[i]}


class RegressionModel(nn.Module):
    """``y = a * x + b`` returning ``(loss, y)`` (HF's ``RegressionModel``, without its ``**kwargs``: HF 5 gives a
    forward that takes ``**kwargs`` ``num_items_in_batch`` and skips the 1/accumulation scaling, a documented
    difference tested on its own)."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(float(a)))
        self.b = nn.Parameter(torch.tensor(float(b)))
        self.double_output = double_output

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        y = input_x * self.a + self.b
        if labels is None:
            return (y, y) if self.double_output else (y,)
        loss = nn.functional.mse_loss(y, labels)
        return (loss, y, y) if self.double_output else (loss, y)


def hf_names(which: str) -> Any:
    """The HF names from ``transformers`` (``which="hf"``) or from ``taskfit.hf`` (``which="tf"``)."""
    if which == "hf":
        import transformers as m
    else:
        import taskfit.hf as m
    return m


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def both(scenario: Callable[[Any, str], Any], tmp_path: Any) -> tuple[Any, Any]:
    """Run ``scenario(module, output_dir)`` under transformers and under taskfit.hf."""
    out = []
    for which in ("hf", "tf"):
        d = os.path.join(str(tmp_path), which)
        out.append(scenario(hf_names(which), d))
    return out[0], out[1]


VOLATILE = ("_runtime", "_per_second", "total_flos", "_model_preparation_time")


def stable(row: dict[str, Any]) -> dict[str, Any]:
    """A log row or metrics dict without the wall-clock keys (and ``total_flos``, a documented difference)."""
    return {k: v for k, v in row.items() if not k.endswith(VOLATILE)}


def args_for(m: Any, output_dir: str, **kw: Any) -> Any:
    """TrainingArguments with the suite's defaults: CPU, no reports, no progress bars, no saves unless asked."""
    base = dict(output_dir=output_dir, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                learning_rate=0.1, num_train_epochs=2, logging_steps=4, report_to="none", use_cpu=True,
                save_strategy="no", disable_tqdm=True, seed=42,
                optim="adamw_torch_fused")  # HF 5's default, and taskfit's with torch >= 2.8
    base.update(kw)
    return m.TrainingArguments(**base)


def summary(trainer: Any, result: Any = None) -> dict[str, Any]:
    """What a scenario compares: weights, log history, the TrainOutput (without wall-clock keys)."""
    out: dict[str, Any] = {"weights": weights(trainer.model),
                           "log_history": [stable(r) for r in trainer.state.log_history],
                           "global_step": trainer.state.global_step}
    if result is not None:
        out["train_output"] = (result.global_step, result.training_loss, stable(result.metrics))
        # HF's printer/progress callback pops total_flos from the very dict TrainOutput returns; taskfit keeps it
        # there (documented difference) and both have it in log_history
        out["train_metric_keys"] = sorted(set(result.metrics) - {"total_flos"})
    return out


def assert_same(a: Any, b: Any, path: str = "", close: tuple[str, ...] = ()) -> None:
    """Exact equality of nested dicts / lists / tensors / arrays / floats, with the path of the first mismatch;
    dict keys named in ``close`` compare to a relative 1e-6 (documented differences of summation order)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            if k in close:
                assert abs(a[k] - b[k]) <= 1e-6 * abs(a[k]), f"{path}.{k}: {a[k]!r} != {b[k]!r}"
            else:
                assert_same(a[k], b[k], f"{path}.{k}", close)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", close)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"
