"""Result types and metric helpers: ``EvalPrediction``, ``PredictionOutput``, speed metrics (F-EVAL-1, F-EVAL-4,
F-EVAL-5). Names and formats mirror the HF Trainer's."""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import numpy as np


class EvalPrediction:
    """What ``compute_metrics`` receives (mirrors ``transformers.EvalPrediction``, including its tuple behaviour:
    ``logits, labels = eval_pred`` unpacks two items, three with inputs).

    Attributes:
        predictions (np.ndarray | tuple): model outputs, concatenated over batches (shape ``(N, ...)``).
        label_ids (np.ndarray | tuple | None): labels, concatenated the same way.
        inputs (np.ndarray | None): the model's main input column, with ``include_for_metrics=["inputs"]``.
        losses (np.ndarray | None): each sample's batch loss, with ``include_for_metrics=["loss"]``.
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions, self.label_ids, self.inputs, self.losses = predictions, label_ids, inputs, losses
        self._elements = ((predictions, label_ids) + ((inputs,) if inputs is not None else ())
                          + ((losses,) if losses is not None else ()))

    def __iter__(self) -> Any:
        return iter(self._elements)

    def __getitem__(self, idx: int) -> Any:
        if not -len(self._elements) <= idx < len(self._elements):
            raise IndexError("tuple index out of range")
        return self._elements[idx]

    def __len__(self) -> int:
        return len(self._elements)

    def __repr__(self) -> str:
        return (f"EvalPrediction(predictions={self.predictions!r}, label_ids={self.label_ids!r}, "
                f"inputs={self.inputs!r}, losses={self.losses!r})")


class TrainOutput(NamedTuple):
    """What ``Fit.fit``/``train`` return: HF ``transformers.trainer_utils.TrainOutput``, a NamedTuple
    ``(global_step, training_loss, metrics)`` (``step, loss, metrics = fit.train()`` unpacks it), that also reads
    as the metrics mapping taskfit returned before: ``out["train_loss"]``, ``out.get``, ``out.keys()``,
    ``out.items()``, ``"train_loss" in out`` and ``dict(out)`` (the metrics) work.

    Attributes:
        global_step (int): optimizer steps taken.
        training_loss (float): mean loss per optimizer step over the run.
        metrics (dict[str, float]): ``train_runtime`` (s), ``train_samples_per_second``,
            ``train_steps_per_second``, ``total_flos``, ``train_loss``, ``epoch`` (and the best-model entries).
    """

    global_step: int
    training_loss: float
    metrics: dict[str, float]

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return self.metrics[key] if isinstance(key, str) else tuple.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:  # type: ignore[override]
        return key in self.metrics if isinstance(key, str) else tuple.__contains__(self, key)

    def keys(self) -> Any:
        return self.metrics.keys()

    def values(self) -> Any:
        return self.metrics.values()

    def items(self) -> Any:
        return self.metrics.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self.metrics.get(key, default)


class PredictionOutput(NamedTuple):
    """What ``Fit.predict`` returns (mirrors ``transformers.trainer_utils.PredictionOutput``).

    Attributes:
        predictions (np.ndarray | tuple | list): outputs of ``predict_step``, concatenated over batches.
        label_ids (np.ndarray | None): labels when the data had them.
        metrics (dict[str, float]): ``test_``-prefixed metrics (runtime, samples/s, loss and
            ``compute_metrics`` results when available).
    """

    predictions: Any
    label_ids: Any
    metrics: dict[str, float]


class EvalLoopOutput(NamedTuple):
    """HF ``transformers.trainer_utils.EvalLoopOutput``: what an evaluation loop returns (for HF scripts that
    build or unpack one; ``predictions, label_ids, metrics, num_samples = out``).

    Attributes:
        predictions (np.ndarray | tuple), label_ids (np.ndarray | tuple | None), metrics (dict[str, float] | None),
        num_samples (int | None): the samples evaluated.
    """

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


def speed_metrics(split: str, start_time: float, end_time: float, num_samples: int | None = None,
                  num_steps: int | None = None) -> dict[str, float]:
    """``{split}_runtime`` (seconds), ``{split}_samples_per_second`` and ``{split}_steps_per_second``
    (mirrors HF ``speed_metrics``)."""
    runtime = max(end_time - start_time, 1e-9)
    out = {f"{split}_runtime": round(runtime, 4)}
    if num_samples is not None:
        out[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        out[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    return out


def format_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """Human-readable copy of ``metrics`` (mirrors HF ``metrics_format``): runtimes as h:mm:ss.ss, FLOPs in
    GF, other floats rounded to 4 decimals."""
    out = {}
    for k, v in metrics.items():
        if k.endswith("_runtime") and isinstance(v, (int, float)):
            h, rem = divmod(v, 3600)
            m, s = divmod(rem, 60)
            out[k] = f"{int(h)}:{int(m):02d}:{s:05.2f}"
        elif k == "total_flos" and isinstance(v, (int, float)):
            out[k] = f"{v / 1e9:.0f}GF"
        elif isinstance(v, float):
            out[k] = f"{round(v, 4)}"
        else:
            out[k] = str(v)
    return out


def metrics_table(split: str, metrics: dict[str, Any]) -> str:
    """The text ``log_metrics`` prints: a header and aligned ``key = value`` lines."""
    fm = format_metrics(metrics)
    width = max((len(k) for k in fm), default=0)
    return "\n".join([f"***** {split} metrics *****"] + [f"  {k:<{width}} = {fm[k]:>9}" for k in sorted(fm)])


def save_metrics_json(output_dir: str, split: str, metrics: dict[str, Any], combined: bool = True) -> str:
    """Write ``{split}_results.json`` and merge into ``all_results.json`` (HF ``save_metrics``) under ``output_dir``
    (a local path or fsspec URL); returns the path."""
    from taskfit.io.checkpoint_io import join, write_bytes_atomic

    def dump(obj: dict) -> bytes:
        return json.dumps(obj, indent=4, sort_keys=True).encode()

    path = join(output_dir, f"{split}_results.json")
    write_bytes_atomic(path, dump(metrics))
    if combined:
        import fsspec

        all_path = join(output_dir, "all_results.json")
        fs, inner = fsspec.core.url_to_fs(all_path)
        merged = json.loads(fs.cat_file(inner)) if fs.exists(inner) else {}
        merged.update(metrics)
        write_bytes_atomic(all_path, dump(merged))
    return path


def to_numpy(x: Any) -> Any:
    """Tensors (nested in lists/tuples/dicts) to numpy arrays."""
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    if isinstance(x, (list, tuple)):
        return type(x)(to_numpy(v) for v in x)
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    return x


def nested_concat(batches: list[Any], padding_index: int = -100) -> Any:
    """Concatenate per-batch outputs along dim 0, padding dim 1 with ``padding_index`` when sequence lengths
    differ (mirrors HF ``nested_concat``). Works on numpy arrays nested in tuples/lists/dicts."""
    first = batches[0]
    if isinstance(first, (list, tuple)):
        return type(first)(nested_concat([b[i] for b in batches], padding_index) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: nested_concat([b[k] for b in batches], padding_index) for k in first}
    arrays = [np.atleast_1d(np.asarray(b)) for b in batches]
    if arrays[0].ndim >= 2 and len({a.shape[1:] for a in arrays}) > 1:
        width = max(a.shape[1] for a in arrays)
        padded = []
        for a in arrays:
            out = np.full((a.shape[0], width) + a.shape[2:], padding_index, dtype=a.dtype)
            out[:, : a.shape[1]] = a
            padded.append(out)
        arrays = padded
    return np.concatenate(arrays, axis=0)


def cpu_rss_bytes() -> int:
    """Resident set size of this process in bytes (``psutil`` when installed, else ``/proc/self/statm``; 0
    where neither is available)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryTracker:
    """Memory deltas of one stage in bytes (mirrors HF ``TrainerMemoryTracker``, ``skip_memory_metrics=False``).

    ``start()`` records the baseline (and resets the device's peak counter), ``sample()`` (called per batch)
    keeps the CPU peak, ``stop(stage)`` returns ``{stage}_mem_cpu_alloc_delta`` (RSS at the end minus at the
    start) and ``{stage}_mem_cpu_peaked_delta`` (highest sampled RSS above the end value, 0 when none), plus the
    device's counters from :meth:`Accelerator.memory_stats`: on CUDA ``{stage}_mem_gpu_alloc_delta`` /
    ``{stage}_mem_gpu_peaked_delta`` (``memory_allocated`` / ``max_memory_allocated``), on MPS
    ``{stage}_mem_mps_alloc_delta`` (MPS has no peak counter), on XLA ``{stage}_mem_xla_alloc_delta``. Reading
    the numbers forces no device sync.

    Args:
        device (torch.device | None): the stage's device.
        accelerator (Accelerator | None): its accelerator, asked for the device counters (None: RSS only).
    """

    def __init__(self, device: Any = None, accelerator: Any = None) -> None:
        self.accelerator = accelerator
        self.kind = "gpu" if accelerator is not None and accelerator.name == "cuda" else getattr(accelerator, "name",
                                                                                                 "cpu")
        self.device = device
        self.begin_cpu = self.peak_cpu = 0
        self.begin_dev = 0

    def _device_stats(self) -> dict[str, int]:
        return self.accelerator.memory_stats(self.device) if self.accelerator is not None else {}

    def start(self) -> None:
        """Record the baseline."""
        if self.accelerator is not None:
            self.accelerator.reset_peak_memory_stats(self.device)
        self.begin_dev = self._device_stats().get("allocated", 0)
        self.begin_cpu = self.peak_cpu = cpu_rss_bytes()

    def sample(self) -> None:
        """Update the CPU peak (about 10 microseconds)."""
        self.peak_cpu = max(self.peak_cpu, cpu_rss_bytes())

    def stop(self, stage: str) -> dict[str, int]:
        """The deltas of the stage (bytes), keyed ``{stage}_mem_*``."""
        end = cpu_rss_bytes()
        out = {f"{stage}_mem_cpu_alloc_delta": end - self.begin_cpu,
               f"{stage}_mem_cpu_peaked_delta": max(0, max(self.peak_cpu, end) - end)}
        stats = self._device_stats()
        if "allocated" in stats:
            end_dev = stats["allocated"]
            out[f"{stage}_mem_{self.kind}_alloc_delta"] = end_dev - self.begin_dev
            if "peak_allocated" in stats:
                out[f"{stage}_mem_{self.kind}_peaked_delta"] = max(0, stats["peak_allocated"] - end_dev)
        return out


def take_init_memory(fit: Any) -> dict[str, int]:
    """The construction's memory deltas (``init_mem_*`` and ``before_init_mem_cpu``, bytes) the first time a
    stage asks, then nothing: HF's ``TrainerMemoryTracker`` puts them into the first train/eval/predict metrics.

    Args:
        fit (Any): an object whose ``_init_memory`` (dict | None) holds them (``Fit`` with
            ``skip_memory_metrics=False``); it is cleared here.
    """
    init = getattr(fit, "_init_memory", None) or {}
    if init:
        fit._init_memory = None
    return init


_PREFIXES = ("val_", "eval_", "test_")


def metric_key(name: str, prefix: str) -> str:
    """``name`` if it already carries a stage prefix (``val_``, ``eval_``, ``test_``, ``{prefix}_``), else
    ``{prefix}_{name}`` (HF's ``metric_key_prefix`` rule)."""
    return name if name.startswith(_PREFIXES + (f"{prefix}_",)) else f"{prefix}_{name}"
