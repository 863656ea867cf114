"""Throughput, FLOPs, MFU and memory of training (F-EVAL-4): the :class:`ThroughputMonitor` callback and the
per-device peak FLOP/s table behind model FLOPs utilisation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from taskfit.callbacks.base import Callback
from taskfit.metrics import MemoryTracker, take_init_memory
from taskfit.core.module import infer_batch_size

if TYPE_CHECKING:
    from taskfit.protocols import FitView
    from taskfit.core.module import TaskModule

#: Dense (no sparsity) peak FLOP/s per device from NVIDIA's data sheets, by compute dtype: ``fp64`` (tensor
#: core where there is one), ``fp32`` (CUDA cores), ``tf32``/``bf16``/``fp16`` (tensor cores). Keys are matched
#: against ``torch.cuda.get_device_name()`` (lower case) in this order. A device or dtype not listed has no
#: known peak: MFU is then omitted, never guessed (pass ``ThroughputMonitor(peak_flops=...)`` to set one).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h100 pcie": {"fp64": 51.2e12, "fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "h100": {"fp64": 66.9e12, "fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},  # SXM
    "h200": {"fp64": 66.9e12, "fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "a100": {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "l40s": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12},
    "l4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "a10": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},  # not A10G (different clocks)
    "v100 pcie": {"fp64": 7e12, "fp32": 14e12, "fp16": 112e12},
    "v100": {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 125e12},  # SXM2
    "t4": {"fp32": 8.1e12, "fp16": 65e12},
}


def compute_dtype(precision: Any, tf32: bool = False) -> str:
    """The dtype that bounds matmul speed under a precision plugin: bfloat16 -> ``bf16``, float16 -> ``fp16``,
    float64 -> ``fp64``, float32 -> ``tf32`` when TF32 matmuls are on (``tf32``, from
    ``Accelerator.tf32_enabled``, or ``torch.get_float32_matmul_precision() != "highest"``), else ``fp32``.

    Args:
        precision (Precision | str): the plugin (its ``compute_dtype``), or a precision name (built once).
        tf32 (bool): whether the accelerator has TF32 matmuls switched on.
    """
    import torch

    if isinstance(precision, str):
        from taskfit.precision import build_precision

        precision = build_precision(precision)
    dtype = precision.compute_dtype
    if dtype != torch.float32:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(dtype, str(dtype))
    return "tf32" if tf32 or torch.get_float32_matmul_precision() != "highest" else "fp32"


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Peak FLOP/s of one device from :data:`PEAK_FLOPS`, or None when the device or dtype is not listed
    (always None for CPUs).

    Args:
        device_name (str): e.g. ``"NVIDIA H100 80GB HBM3"``.
        dtype (str): ``fp64``, ``fp32``, ``tf32``, ``bf16`` or ``fp16``.
    """
    name = device_name.lower()
    for key, table in PEAK_FLOPS.items():
        if key in name and not (key == "a10" and ("a100" in name or "a10g" in name)) and not (
                key == "l4" and "l40" in name):
            return table.get(dtype)
    return None


def default_tokens(batch: Any) -> int | None:
    """Input tokens of a batch: the element count of ``input_ids`` (HF ``main_input_name``), which is known
    from the shape (no device sync); None when the batch has no ``input_ids``."""
    if isinstance(batch, Mapping) and hasattr(batch.get("input_ids"), "numel"):
        return int(batch["input_ids"].numel())
    return None


class TokensSeen:
    """HF's count of the input tokens of a micro-batch (mirrors ``Trainer._track_num_input_tokens`` of
    ``include_num_input_tokens_seen``): ``"all"`` counts the elements of the model's ``main_input_name``
    (``input_ids`` unless the model names another), ``"non_padding"`` the sum of ``attention_mask`` when the batch
    has one (else all elements). Returns None for a batch without that input (HF warns and counts nothing).

    Args:
        mode (str): ``"all"`` or ``"non_padding"``.
        main_input_name (str): the batch key of the model's main input (set from the model when training starts).
    """

    def __init__(self, mode: str = "all", main_input_name: str = "input_ids") -> None:
        self.mode, self.main_input_name = mode, main_input_name

    def __call__(self, batch: Any) -> int | None:
        main = batch.get(self.main_input_name) if isinstance(batch, Mapping) else None
        if not hasattr(main, "numel"):
            return None
        mask = batch.get("attention_mask")
        if self.mode == "non_padding" and hasattr(mask, "sum"):
            return int(mask.sum())  # one host sync per micro-batch, as HF's own count; "all" reads shapes only
        return int(main.numel())


class ThroughputMonitor(Callback):
    """Measure training speed per device and add it to the logs (mirrors Lightning's ``ThroughputMonitor``
    and HF's ``include_tokens_per_second`` / ``include_num_input_tokens_seen`` / ``skip_memory_metrics``).

    On each logging step a row is logged (before the loss row of that step) with, over the steps since the
    previous log and excluding time spent in evaluation:

    - ``samples_per_second`` (samples/s), ``tokens_per_second`` (tokens/s, when batches have ``input_ids`` or
      ``length_fn`` counts them), ``num_input_tokens_seen`` (running total, with ``track_tokens_seen``; also
      kept in ``fit.state.num_input_tokens_seen``; with HF's ``include_num_input_tokens_seen`` the count is
      HF's (:class:`TokensSeen`), goes into every logged row as in HF, and an automatically added monitor logs
      no speed row of its own unless ``include_tokens_per_second`` asks for one);
    - ``flops_per_second`` (FLOP/s): FLOPs of one batch, given by ``flops_per_batch`` (an int or
      ``callable(batch)``), by the module's ``flops_per_batch`` attribute, or measured once on the first
      micro-batch with ``torch.utils.flop_counter.FlopCounterMode`` (forward + backward, matmul/conv/attention
      FLOPs), scaled per sample for later batches;
    - ``mfu``: ``flops_per_second / peak``, the peak per device from ``peak_flops`` or :data:`PEAK_FLOPS` for
      the device and precision; omitted (not invented) when the peak is unknown, e.g. on CPU.

    At the end of training ``Fit.fit``'s metrics get ``train_tokens_per_second`` and ``num_input_tokens_seen``
    (tokens), ``train_flops_per_second`` and ``train_mfu`` (training time only), and with ``memory=True`` the
    train stage's memory deltas in bytes (``train_mem_cpu_alloc_delta``, ``train_mem_cpu_peaked_delta``, on
    CUDA ``train_mem_gpu_*``; see :class:`taskfit.metrics.MemoryTracker`). Nothing here reads a device value:
    counts come from shapes, so no step is slowed by a host sync. ``Fit`` adds this callback on its own when
    ``include_tokens_per_second``, ``include_num_input_tokens_seen`` or ``skip_memory_metrics=False`` is set.

    Args:
        flops_per_batch (int | Callable[[Any], int] | None): FLOPs of one training micro-batch (forward and
            backward); None = the module's ``flops_per_batch`` or a measurement.
        peak_flops (float | None): peak FLOP/s of one device, overriding the table.
        measure_flops (bool): measure FLOPs when not given (default True).
        length_fn (Callable[[Any], int] | None): tokens of a batch; default: ``input_ids`` element count.
        track_tokens_seen (bool): log ``num_input_tokens_seen`` on each logging step.
        memory (bool): track the train stage's memory deltas.

    Raises:
        ValueError: ``peak_flops`` or an int ``flops_per_batch`` that is not positive.
    """

    def __init__(self, flops_per_batch: int | Callable[[Any], int] | None = None, peak_flops: float | None = None,
                 measure_flops: bool = True, length_fn: Callable[[Any], int] | None = None,
                 track_tokens_seen: bool = False, memory: bool = False) -> None:
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(f"peak_flops must be a positive FLOP/s value; got {peak_flops!r}.")
        if isinstance(flops_per_batch, (int, float)) and not flops_per_batch > 0:
            raise ValueError(f"flops_per_batch must be a positive FLOP count or a callable; got {flops_per_batch!r}.")
        self.flops_per_batch, self.user_peak = flops_per_batch, peak_flops
        self.measure_flops, self.length_fn = measure_flops, length_fn or default_tokens
        self.track_tokens_seen, self.memory = track_tokens_seen, memory
        #: log a speed row per logging step (off when the monitor exists only to count HF's tokens seen)
        self.log_speed = True
        self.peak: float | None = None
        self.flops_per_sample: float | None = None
        self._fit: FitView | None = None
        self._counter: Any = None
        self._tracker: MemoryTracker | None = None
        self._eval_start: float | None = None

    # ---------------------------------------------------------------------------------------- set-up ---
    def on_train_start(self, fit: FitView, module: TaskModule) -> None:
        self._fit = fit
        device = fit.strategy.root_device
        self.peak = self.user_peak
        if self.peak is None:  # a device model listed in PEAK_FLOPS (CUDA GPUs), else None
            accelerator = fit.strategy.accelerator
            self.peak = peak_flops(accelerator.device_name(device),
                                   compute_dtype(fit.strategy.precision, accelerator.tf32_enabled()))
        if isinstance(self.length_fn, TokensSeen):  # HF reads the model's main_input_name
            model = getattr(module, "model", module)
            self.length_fn.main_input_name = getattr(model, "main_input_name", "input_ids")
        given = self.flops_per_batch if self.flops_per_batch is not None else getattr(module, "flops_per_batch", None)
        self._given = given
        self.flops_per_sample = None
        self.samples = self.tokens = 0
        self.has_tokens = False
        self.eval_time = 0.0
        self.start = self.window_start = time.perf_counter()
        self.window_samples = self.window_tokens = 0
        self.window_eval_time = 0.0
        if self.memory:
            self._tracker = MemoryTracker(device, fit.strategy.accelerator)
            self._tracker.start()

    # ------------------------------------------------------------------------------------- per batch ---
    def on_train_batch_start(self, fit: FitView, module: TaskModule, batch: Any, batch_idx: int) -> None:
        if self.flops_per_sample is None and self._given is None and self.measure_flops and self._counter is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def on_train_batch_end(self, fit: FitView, module: TaskModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        bs = infer_batch_size(batch)
        if self.flops_per_sample is None:
            flops = None
            if self._counter is not None:
                self._counter.__exit__(None, None, None)
                flops, self._counter = self._counter.get_total_flops(), None
            elif self._given is not None:
                flops = self._given(batch) if callable(self._given) else self._given
            if flops is not None and bs:
                self.flops_per_sample = float(flops) / bs
        tokens = self.length_fn(batch)
        if tokens is not None:
            self.has_tokens = True
            self.tokens += tokens
            self.window_tokens += tokens
            fit.state.num_input_tokens_seen += tokens
        self.samples += bs
        self.window_samples += bs
        if self._tracker is not None:
            self._tracker.sample()

    def on_exception(self, fit: FitView, module: TaskModule, exception: BaseException) -> None:
        if self._counter is not None:
            self._counter.__exit__(None, None, None)
            self._counter = None

    # evaluation time is left out of the training speed
    def on_validation_start(self, fit: FitView, module: TaskModule) -> None:
        self._eval_start = time.perf_counter()

    def on_validation_end(self, fit: FitView, module: TaskModule) -> None:
        if self._fit is not None and self._eval_start is not None:
            spent = time.perf_counter() - self._eval_start
            self.eval_time += spent
            self.window_eval_time += spent
            self._eval_start = None

    # ------------------------------------------------------------------------------------------ logs ---
    def _speed(self, samples: int, tokens: int, seconds: float, prefix: str = "") -> dict[str, float]:
        seconds = max(seconds, 1e-9)
        out = {f"{prefix}samples_per_second": round(samples / seconds, 3)}
        if self.has_tokens:
            out[f"{prefix}tokens_per_second"] = round(tokens / seconds, 3)
        if self.flops_per_sample is not None:
            fps = self.flops_per_sample * samples / seconds
            out[f"{prefix}flops_per_second"] = fps
            if self.peak:
                out[f"{prefix}mfu"] = fps / self.peak
        return out

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """HF hook, after the loop set this step's flags: on a logging step, log the window's speed."""
        if not control.should_log or self._fit is None or not self.window_samples or not self.log_speed:
            return
        now = time.perf_counter()
        logs = self._speed(self.window_samples, self.window_tokens, now - self.window_start - self.window_eval_time)
        # with include_num_input_tokens_seen, Fit.log adds the count to every row itself (as HF's Trainer.log)
        if self.track_tokens_seen and self.has_tokens and args.include_num_input_tokens_seen in ("no", False, None):
            logs["num_input_tokens_seen"] = state.num_input_tokens_seen
        self.window_start, self.window_samples, self.window_tokens, self.window_eval_time = now, 0, 0, 0.0
        self._fit.log(logs)

    def train_metrics(self) -> dict[str, float]:
        """Whole-run numbers for ``Fit.fit``'s metrics (see the class docstring); empty before training."""
        if self._fit is None:
            return {}
        total = time.perf_counter() - self.start
        out = {}
        if self.has_tokens:
            out["train_tokens_per_second"] = round(self.tokens / max(total, 1e-9), 3)
            out["num_input_tokens_seen"] = self._fit.state.num_input_tokens_seen
        speed = self._speed(self.samples, self.tokens, total - self.eval_time)
        for key in ("flops_per_second", "mfu"):
            if key in speed:
                out[f"train_{key}"] = speed[key]
        if self._tracker is not None:
            out.update(take_init_memory(self._fit))  # the construction's deltas go with the first stage (HF)
            out.update(self._tracker.stop("train"))
        return out


def with_throughput_monitor(args: Any, callbacks: list[Any]) -> list[Any]:
    """``callbacks`` plus a :class:`ThroughputMonitor` when ``args`` asks for tokens per second, tokens seen
    or memory metrics and none is given (a given one gets those options switched on)."""
    tokens_seen = args.include_num_input_tokens_seen not in (False, None, "no")  # HF 5: "no" | "all" | "non_padding"
    wanted = args.include_tokens_per_second or tokens_seen or not args.skip_memory_metrics
    monitor = next((cb for cb in callbacks if isinstance(cb, ThroughputMonitor)), None)
    if wanted and monitor is None:
        monitor = ThroughputMonitor()
        # HF logs no speed row of its own: tokens seen go into every row (Fit.log), memory into the metrics
        monitor.log_speed = bool(args.include_tokens_per_second) or not tokens_seen
        callbacks = [*callbacks, monitor]
    if monitor is not None:
        if tokens_seen and monitor.length_fn is default_tokens:  # HF's count ("all" / "non_padding")
            monitor.length_fn = TokensSeen(args.include_num_input_tokens_seen)
        monitor.track_tokens_seen = monitor.track_tokens_seen or tokens_seen
        monitor.memory = monitor.memory or not args.skip_memory_metrics
    return callbacks
