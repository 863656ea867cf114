"""The evaluation loop behind ``Fit.validate``/``test``/``predict`` (F-EVAL-1, F-EVAL-2, F-EVAL-3).

Per batch: the step's loss, predictions and labels; predictions replaced by ``model.generate`` output with
``predict_with_generate``; collected on the device and moved to host numpy every ``eval_accumulation_steps``
batches (bounded device memory); after the pass, gathered across processes in dataset order
(:mod:`taskfit.loops.gather`), then ``compute_metrics`` and ``torchmetrics`` objects (which sync across
processes in their own ``compute``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from taskfit.core.hook_logging import named_step
from taskfit.core.step_call import by_signature
from taskfit.loops.gather import gather_in_dataset_order, loader_indices
from taskfit.metrics import metric_key
from taskfit.metrics import EvalPrediction, MemoryTracker, take_init_memory, nested_concat, speed_metrics, to_numpy
from taskfit.core.module import infer_batch_size
from taskfit.core.hooks import batch_mover, lightning_overrides, module_modes
from taskfit.optim.hf_optimizers import set_optimizer_mode
from taskfit.core.results import ResultCollection
from taskfit.core.wrapping import ModelTaskModule

if TYPE_CHECKING:
    from taskfit.protocols import FitView



def _own_hook(module: Any, name: str) -> Any:
    """The module's bound hook ``name`` when its class (or the instance) overrides the default (None otherwise),
    run as the module's running hook ``name`` (``self.log`` reads it)."""
    from taskfit.core.hooks import LightningHooks

    from taskfit.core.hook_logging import named

    if name in getattr(module, "__dict__", ()):  # set on the instance; None: none
        return named(module, name, module.__dict__[name])
    own = getattr(type(module), name, None)
    return named(module, name, getattr(module, name)) if own is not None and own is not getattr(
        LightningHooks, name, None) else None


def is_loader_list(data: Any) -> bool:
    """True for a list or tuple of ``DataLoader``/``Dataset`` objects: several evaluation loaders (Lightning)."""
    from torch.utils.data import DataLoader, Dataset

    return isinstance(data, (list, tuple)) and bool(data) and all(isinstance(d, (DataLoader, Dataset)) for d in data)


def _batch_labels(batch: Any, label_names: list[str]) -> Any:
    if isinstance(batch, Mapping):
        found = [batch[k] for k in label_names if k in batch]
        return (found[0] if len(found) == 1 else tuple(found)) if found else None
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return batch[-1]
    return None


def _batch_inputs(batch: Any, main_input_name: str, strict: bool = True) -> Any:
    """The inputs ``compute_metrics`` gets with ``include_for_metrics=["inputs"]``: the batch's ``main_input_name``
    column (HF: the model's ``main_input_name``, default ``"input_ids"``), the first element of a tuple batch.

    Raises:
        KeyError: a dict batch without that column (``strict``: a plain model's run, as HF).
    """
    if isinstance(batch, Mapping):
        if main_input_name not in batch and not strict:  # a TaskModule's dict batch: its first column
            return next(iter(batch.values()), None)
        if main_input_name not in batch:
            raise KeyError(f"include_for_metrics=['inputs'] passes the model's main input {main_input_name!r} "
                           f"(its main_input_name) to compute_metrics, but the batch has only {sorted(batch)}.")
        return batch[main_input_name]
    if isinstance(batch, (list, tuple)):
        return batch[0]
    return batch


def _nbytes(item: Any) -> int:
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, (list, tuple)):
        return sum(_nbytes(x) for x in item)
    if isinstance(item, Mapping):
        return sum(_nbytes(x) for x in item.values())
    return 0


def _is_metric(value: Any) -> bool:
    return hasattr(value, "compute") and hasattr(value, "update") and hasattr(value, "reset")


class _Collector:
    """Keeps per-batch tensors on the device and moves them to host numpy every ``flush_every`` batches
    (``eval_accumulation_steps``; None = once at the end). ``peak_device_bytes`` is the most bytes of
    outputs held on the device at once: with ``flush_every=N`` at most N batches' worth."""

    def __init__(self, flush_every: int | None) -> None:
        self.flush_every = flush_every
        self.device_items: list[Any] = []
        self.host_items: list[Any] = []
        self.device_bytes = self.peak_device_bytes = 0

    def add(self, item: Any) -> None:
        if item is None:
            return
        self.device_items.append(item)
        self.device_bytes += _nbytes(item)
        self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)
        if self.flush_every and len(self.device_items) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        self.host_items.extend(to_numpy(x) for x in self.device_items)
        self.device_items, self.device_bytes = [], 0

    def clear(self) -> None:
        """Drop the device items (``batch_eval_metrics`` consumed them)."""
        self.device_items, self.device_bytes = [], 0

    def result(self, concat: bool) -> Any:
        self.flush()
        if not self.host_items:
            return None
        return nested_concat(self.host_items) if concat else self.host_items


def _padding_free_limit(loader: Any) -> int | None:
    """Dataset length when ``loader`` splits it with the ``DistributedSampler`` padding rule (global position
    ``rank + i * world_size`` >= length is a repeat); None when the padding cannot be told apart."""
    from torch.utils.data import DistributedSampler

    from taskfit.data.samplers import DistributedSamplerWrapper

    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSamplerWrapper):
        return len(sampler.sampler)
    if isinstance(sampler, DistributedSampler) and not sampler.drop_last:
        return len(sampler.dataset)
    return None


class _Pass:
    """The working state of one evaluation pass (what ``EvaluationLoop.run``'s steps share)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()  # dataset indices already given to batch_eval_metrics (drops sampler repeats)
        self.batch_bounds = [0]
        self.returned_metrics: dict[str, Any] = {}
        self.loss_sum: Any = None
        self.n_samples = self.n_real = self.n_batches = 0
        self.batch_metrics: Any = None
        self.results: Any = None
        self.idx: int | None = None
        self.extra: tuple = ()
        self.start = 0.0


class EvaluationLoop:
    """Run one pass over a loader in evaluation mode.

    Args:
        fit (Fit): the run (module, strategy, hooks, arguments, metric functions).
        stage (str): ``"validate"``, ``"test"`` or ``"predict"``.
        dataloader_idx (int | None): index of this loader among several given as a list (Lightning's
            ``dataloader_idx``: passed to the step, suffixes the pass's keys); None for a single loader.
        results (ResultCollection | None): the collection ``self.log`` writes to, shared by the loaders of a
            list; None makes one for this pass.
        first, last (bool): whether this pass starts / ends the evaluation (the ``on_*_start``/``epoch_start``
            and ``on_*_epoch_end``/``end`` hooks and the logged epoch values belong to the whole evaluation).
    """

    def __init__(self, fit: FitView, stage: str, hooks: Any, ignore_keys: list[str] | None = None, *,
                 dataloader_idx: int | None = None, results: ResultCollection | None = None, first: bool = True,
                 last: bool = True) -> None:
        self.fit, self.stage, self.hooks, self.ignore_keys = fit, stage, hooks, ignore_keys
        self.dataloader_idx, self.results, self.first, self.last = dataloader_idx, results, first, last
        self.hidden: set[str] = set()

    def run(self, loader: Any, prefix: str) -> tuple[dict[str, float], Any, Any]:
        """Evaluate every batch of ``loader``; returns ``(metrics, predictions, label_ids)``.

        Predictions and labels are numpy arrays concatenated over batches (padded with -100 where sequence
        lengths differ), collected in ``predict`` and, for other stages, when ``compute_metrics`` is set and
        ``prediction_loss_only`` is False. With ``predict_with_generate`` the predictions are the ids that
        ``generate`` returned. With several processes they are gathered in dataset order. The collector's peak
        device bytes of predictions are kept in ``self.peak_device_bytes``.

        Raises:
            TypeError: a step returned something that is neither None, a tensor nor a dict.
            ValueError: ``predict_with_generate`` with a model that has no ``generate`` (before any batch).
        """
        fit, module = self.fit, self.fit.module
        p = self._plan(loader)
        was_training = module.training
        restore_modes = module_modes(module)  # put back per submodule (a frozen one stays in eval)
        # the module's on_{stage}_model_eval/train when overridden (Lightning), once per evaluation of several loaders
        model_eval, model_train = (_own_hook(module, f"on_{p.hook_stage}_model_{m}") for m in ("eval", "train"))
        if model_train is not None and not lightning_overrides(module, f"on_{p.hook_stage}_model_train"):
            model_train = None  # a wrapper around the default: Lightning restores the modes itself
        custom = model_eval is not None or model_train is not None
        if not custom:
            module.eval()
        elif self.first:
            (model_eval or module.eval)()
        run_ = getattr(fit, "_run", None)  # schedule-free optimizers evaluate at their eval point (as HF)
        set_optimizer_mode(getattr(run_, "optimizers", None) if run_ is not None else fit.optimizers, "eval")
        prev_results, prev_defaults = module._results, module._log_defaults
        prev_ignore = getattr(module, "ignore_keys", None)
        if isinstance(module, ModelTaskModule):  # a plain model's predictions leave these outputs out (HF)
            module.ignore_keys = self.ignore_keys
        # evaluation epoch values are full-set values across processes unless logged with sync_dist=False
        p.results = module._results = self.results or ResultCollection(infer_batch_size, fit.strategy.reduce,
                                                                       sync_by_default=True)
        p.results.dataloader_idx = p.idx = self.dataloader_idx
        p.extra = () if p.idx is None else (p.idx,)  # Lightning passes dataloader_idx only with several loaders
        module._log_defaults = (False, True)
        try:
            fit.num_eval_batches = len(loader) if hasattr(loader, "__len__") else None
        except TypeError:
            fit.num_eval_batches = None
        try:
            if p.memory is not None:
                p.memory.start()
            p.start = time.perf_counter()
            with self._grad_context():  # the start hooks too (Lightning runs the whole loop inside it)
                if self.first:
                    self.hooks.call(f"on_{p.hook_stage}_start", fit, module)
                    self.hooks.call(f"on_{p.hook_stage}_epoch_start", fit, module)
                self._run_batches(p, loader)
            return self._finish(p, prefix)
        finally:  # an exception inside a step must not leave the module in eval mode or with eval results
            module._results, module._log_defaults = prev_results, prev_defaults
            if isinstance(module, ModelTaskModule):
                module.ignore_keys = prev_ignore
            if custom and self.last and model_train is not None:
                model_train()
            elif was_training and (not custom or self.last):
                restore_modes()

    def _grad_context(self) -> Any:
        """``torch.inference_mode()`` for ``validate``/``test``/``predict`` where the run's policy asks for it
        (Lightning's ``Trainer(inference_mode=True)``), except with parameters sharded over processes or a gloo
        process group (Lightning's exceptions for FSDP and gloo); ``torch.no_grad()`` otherwise: HF, and the
        validation inside ``fit`` (Lightning's fit loop builds its validation loop with ``inference_mode=False``)."""
        fit = self.fit
        in_fit = fit.run is not None and fit.run.stage == "fit"
        if fit.loop_policy.eval_inference_mode and not in_fit and not fit.strategy.shards_parameters and not (
                torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_backend() == "gloo"):
            return torch.inference_mode()
        return torch.no_grad()

    def _plan(self, loader: Any) -> _Pass:
        """What the pass decides before its first batch (the step, what it collects, the sampler split)."""
        fit, stage, p = self.fit, self.stage, _Pass()
        module, strategy, args = fit.module, fit.strategy, fit.args
        # through the DDP/FSDP wrapper's forward (FSDP all-gathers the root's parameters in its hooks)
        step_name = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}[stage]
        # called with the arguments its signature accepts (Lightning allows dropping batch_idx/dataloader_idx)
        p.step_fn = by_signature(strategy.step_function(module, step_name), getattr(module, step_name))
        if fit.loop_policy.log_hooks is not None:  # self.log reads the running hook (Lightning's _current_fx_name)
            p.step_fn = named_step(module, step_name, p.step_fn)
        p.hf_step = fit._hf_prediction_step(fit._run, stage, self.ignore_keys)  # a prediction_step override (HF)
        p.hook_stage = "validation" if stage == "validate" else stage
        p.compute_metrics = fit.compute_metrics
        p.collect = not args.prediction_loss_only and (stage == "predict" or p.compute_metrics is not None)
        p.generate = self._generation_setup() if p.collect and args.predict_with_generate else None
        p.preprocess = fit.preprocess_logits_for_metrics
        include = set(getattr(args, "include_for_metrics", None) or ())
        p.with_inputs = "inputs" in include or args.include_inputs_for_metrics
        p.with_losses = "loss" in include
        p.main_input = getattr(fit.model, "main_input_name", "input_ids")
        p.strict_inputs = isinstance(module, ModelTaskModule)  # a plain model: HF's KeyError
        p.label_names = args.label_names or getattr(module, "label_names", None) or ["labels"]
        # in predict() too, which still returns the predictions (HF)
        p.batch_metrics_mode = args.batch_eval_metrics and p.compute_metrics is not None
        p.distributed = strategy.world_size > 1
        p.indices = loader_indices(loader) if p.distributed else None
        p.real_limit = _padding_free_limit(loader) if p.distributed else None
        # the sampler's split: over the data-parallel ranks (tensor-parallel ranks read the same samples)
        p.rank = strategy.data_parallel_rank
        p.world = strategy.data_parallel_size
        p.preds, p.labels, p.inputs, p.losses = (_Collector(args.eval_accumulation_steps) for _ in range(4))
        p.memory = None if args.skip_memory_metrics else MemoryTracker(strategy.root_device, strategy.accelerator)
        return p

    def _run_batches(self, p: _Pass, loader: Any) -> None:
        """The pass's steps: per batch the step, its loss sum and the collected outputs, and the hooks."""
        fit, hooks, strategy = self.fit, self.hooks, self.fit.strategy
        module, args = fit.module, fit.args
        move, results, hook_stage = batch_mover(module, strategy), p.results, p.hook_stage
        reads_outputs = fit.loop_policy.reads_eval_outputs or self.stage == "predict"
        for batch_idx, batch in enumerate(loader):
            batch = move(batch, p.idx or 0)
            results.set_batch(batch)
            bs = infer_batch_size(batch)
            weight = bs
            if p.real_limit is not None:  # the sampler's padding repeats count nowhere (loss, logged means)
                weight = sum(1 for i in range(p.n_samples, p.n_samples + bs) if p.rank + i * p.world < p.real_limit)
                results._batch_size = weight
            hooks.call(f"on_{hook_stage}_batch_start", fit, module, batch, batch_idx, *p.extra)
            with strategy.forward_context():
                out = p.step_fn(batch, batch_idx, *p.extra) if p.hf_step is None else p.hf_step(batch)
            if reads_outputs:
                loss, logits, lab = self._unpack(out, batch, p.label_names, p.returned_metrics)
            else:  # Lightning: the step's return goes only to the batch-end hooks
                loss = logits = lab = None
            if loss is not None:
                weighted = loss.detach().float() * weight
                p.loss_sum = weighted if p.loss_sum is None else p.loss_sum + weighted
            if p.collect:
                self._collect(p, batch, batch_idx, bs, loss, logits, lab)
            p.n_samples += bs
            p.n_real += weight
            p.n_batches += 1
            p.batch_bounds.append(p.n_samples)
            if p.memory is not None:
                p.memory.sample()
            hooks.call(f"on_{hook_stage}_batch_end", fit, module, out, batch, batch_idx, *p.extra)
            if hooks.hf["on_prediction_step"]:
                hooks.call_hf("on_prediction_step", args, fit.state, fit.control)

    def _collect(self, p: _Pass, batch: Any, batch_idx: int, bs: int, loss: Any, logits: Any, lab: Any) -> None:
        """Keep one batch's predictions, labels, inputs and losses (or feed ``batch_eval_metrics``)."""
        if p.generate is not None:
            logits = p.generate(batch, p.label_names)
        elif p.preprocess is not None and logits is not None:  # in predict() too (HF)
            logits = p.preprocess(logits, lab)
        p.preds.add(logits)
        p.labels.add(lab)
        if p.with_inputs:
            p.inputs.add(_batch_inputs(batch, p.main_input, p.strict_inputs))
        if p.with_losses and loss is not None:  # HF: the batch's loss once per sample
            p.losses.add(loss.detach().reshape(()).repeat(bs))
        if p.batch_metrics_mode and logits is not None and lab is not None:
            self._batch_metrics(p, batch, batch_idx, bs, loss, logits, lab)

    def _batch_metrics(self, p: _Pass, batch: Any, batch_idx: int, bs: int, loss: Any, logits: Any,
                       lab: Any) -> None:
        """``batch_eval_metrics``: this batch's outputs of every process, as tensors (HF hands tensors), to
        ``compute_metrics(EvalPrediction, compute_result=is_last_batch)``; evaluate keeps no outputs, predict
        still returns them (HF)."""
        strategy, seen = self.fit.strategy, p.seen
        rows = p.indices[p.n_samples:p.n_samples + bs] if p.indices is not None else None
        inputs = _batch_inputs(batch, p.main_input, p.strict_inputs) if p.with_inputs else None
        losses = loss.detach().reshape(()).repeat(bs) if p.with_losses and loss is not None else None
        before = set(seen)  # the first gather adds this batch's kept indices to `seen`
        if p.distributed:
            logits, lab, inputs, losses = (
                _as_tensors(gather_in_dataset_order(strategy, to_numpy(v), rows, set(before) if i else seen))
                for i, v in enumerate((logits, lab, inputs, losses)))
        p.batch_metrics = p.compute_metrics(EvalPrediction(logits, lab, inputs, losses),
                                            compute_result=batch_idx + 1 == self.fit.num_eval_batches)
        if self.stage != "predict":
            p.preds.clear(), p.labels.clear(), p.inputs.clear(), p.losses.clear()

    def _finish(self, p: _Pass, prefix: str) -> tuple[dict[str, float], Any, Any]:
        """After the last batch: gathered outputs, the epoch-end hooks and logged values, the metrics."""
        fit, hooks, module = self.fit, self.hooks, self.fit.module
        concat = fit.args.eval_do_concat_batches
        self.peak_device_bytes = p.preds.peak_device_bytes
        all_preds, all_labels = p.preds.result(concat), p.labels.result(concat)
        all_inputs = p.inputs.result(concat) if p.with_inputs else None
        all_losses = p.losses.result(concat) if p.with_losses else None
        if p.distributed:
            all_preds, all_labels, all_inputs, all_losses = (
                self._gather(x, p.indices, p.batch_bounds, concat) for x in (all_preds, all_labels, all_inputs,
                                                                             all_losses))
        logged: dict[str, Any] = {}
        aliases: dict[str, Any] = {}  # callback_metrics only: `name` for `name_epoch` (Lightning)
        if self.last:
            results = p.results
            results.dataloader_idx = None  # values logged in on_*_epoch_end get no suffix (Lightning)
            hooks.call(f"on_{p.hook_stage}_epoch_end", fit, module)  # may still log epoch values (Lightning)
            # HF's prefix rule for self.log names; an empty prefix (the Lightning door) keeps them as logged
            key = (lambda k: metric_key(k, prefix)) if prefix else (lambda k: k)
            logged = {key(k): v for k, v in results.epoch_values(logger_only=False).items()}
            self.hidden = {key(k) for k in results.hidden_names()}  # logger=False: no loggers
            aliases = {key(k): logged[key(f)] for k, f in results.epoch_aliases().items() if key(f) in logged}
            results.reset_epoch()  # logged torchmetrics objects start fresh at the next evaluation
        metrics = self._metrics(p, prefix, all_preds, all_labels, all_inputs, all_losses)
        metrics = {**logged, **metrics}
        # Lightning's callback_metrics hold only what self.log wrote (not the speed and timing rows)
        fit.callback_metrics.update({**(metrics if fit.loop_policy.logs_run_values else logged), **aliases})
        if self.last:
            hooks.call(f"on_{p.hook_stage}_end", fit, module)
        return metrics, all_preds, all_labels

    def _metrics(self, p: _Pass, prefix: str, all_preds: Any, all_labels: Any, all_inputs: Any,
                 all_losses: Any) -> dict[str, Any]:
        """The pass's own values: returned torchmetrics, the loss, ``compute_metrics``, speed and memory."""
        strategy, stage = self.fit.strategy, self.stage
        metrics: dict[str, Any] = {}
        for name, metric in p.returned_metrics.items():  # returned torchmetrics objects: compute, then reset
            metrics[metric_key(name, prefix)] = float(metric.compute())
            metric.reset()
        if p.loss_sum is not None:
            total = strategy.reduce(torch.tensor(float(p.n_samples if p.real_limit is None else p.n_real),
                                                 device=p.loss_sum.device), "sum")
            # a float32 mean, as HF's (numpy float32 mean of the per-sample losses)
            metrics[f"{prefix}_loss"] = float(strategy.reduce(p.loss_sum, "sum") / total.clamp(min=1.0))
        if p.compute_metrics is not None and (stage != "predict" or all_labels is not None):
            if p.batch_metrics_mode:
                extra = p.batch_metrics or {}
            elif all_preds is not None:
                extra = p.compute_metrics(EvalPrediction(all_preds, all_labels, all_inputs, all_losses))
            else:
                extra = {}
            metrics.update({metric_key(k, prefix): float(v) if isinstance(v, (int, float)) else v
                            for k, v in (extra or {}).items()})
        metrics.update(speed_metrics(prefix, p.start, time.perf_counter(), p.n_samples, p.n_batches))
        if p.memory is not None:
            if not getattr(self.fit, "is_in_train", False):  # an evaluation inside training leaves them to train (HF)
                metrics.update(take_init_memory(self.fit))
            metrics.update(p.memory.stop(prefix))
        if p.idx is not None:  # this loader's own values (loss, compute_metrics, speed) keep apart
            metrics = {f"{k}/dataloader_idx_{p.idx}": v for k, v in metrics.items()}
        return metrics

    def _gather(self, value: Any, indices: list[int] | None, bounds: list[int], concat: bool) -> Any:
        """Outputs of every process in dataset order (per batch when ``eval_do_concat_batches=False``)."""
        strategy = self.fit.strategy
        if concat or value is None:
            return gather_in_dataset_order(strategy, value, indices)
        seen: set[int] = set()
        return [gather_in_dataset_order(strategy, v, indices[bounds[i]:bounds[i + 1]] if indices is not None else None,
                                        seen) for i, v in enumerate(value)]

    def _generation_setup(self) -> Any:
        """``(batch, label_names) -> generated ids`` for ``predict_with_generate`` (mirrors HF
        ``Seq2SeqTrainer.prediction_step``): the batch without labels and decoder inputs goes to
        ``model.generate`` with ``generation_config`` (a ``GenerationConfig``, dict, JSON file/folder or model
        id), ``generation_max_length`` as ``max_length`` and ``generation_num_beams`` as ``num_beams``; outputs
        shorter than ``max_length`` are padded with the pad token id (so batches line up; across batches -100).

        Raises:
            ValueError: the model has no ``generate`` method.
        """
        fit, args = self.fit, self.fit.args
        inner = getattr(fit.module, "model", None)  # the HF model inside a ModelTaskModule
        model = inner if callable(getattr(inner, "generate", None)) else fit.module
        if not callable(getattr(model, "generate", None)):
            raise ValueError(f"predict_with_generate=True needs a model with a generate() method (a transformers "
                             f"encoder-decoder or causal LM); {type(model).__name__} has none.")
        kwargs: dict[str, Any] = {}
        config = args.generation_config
        if config is not None:
            from transformers import GenerationConfig

            if isinstance(config, dict):
                config = GenerationConfig(**config)
            elif isinstance(config, str):
                config = GenerationConfig.from_pretrained(config)
            kwargs["generation_config"] = config
        if args.generation_max_length is not None:
            kwargs["max_length"] = args.generation_max_length
        if args.generation_num_beams is not None:
            kwargs["num_beams"] = args.generation_num_beams
        base = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        max_length = kwargs.get("max_length", getattr(base, "max_length", None))
        max_new = getattr(base, "max_new_tokens", None) if "max_length" not in kwargs else None
        pad = getattr(base, "pad_token_id", None)
        if pad is None:
            pad = getattr(getattr(model, "config", None), "pad_token_id", None)
        pad = -100 if pad is None else int(pad)
        target = (max_new + 1) if max_new is not None else max_length

        def generate(batch: Any, label_names: list[str]) -> torch.Tensor:
            drop = set(label_names) | {"decoder_input_ids", "decoder_attention_mask"}
            gen_inputs = {k: v for k, v in batch.items() if k not in drop}
            ids = model.generate(**gen_inputs, **kwargs)
            if target is not None and ids.shape[-1] < target:
                ids = torch.nn.functional.pad(ids, (0, target - ids.shape[-1]), value=pad)
            return ids

        return generate

    def _unpack(self, out: Any, batch: Any, label_names: list[str],
                metrics: dict[str, Any]) -> tuple[Any, Any, Any]:
        """``(loss, predictions, labels)`` from a step's return value; ``torchmetrics`` objects in a returned
        dict are put into ``metrics`` (name -> metric) to be computed and reset after the pass."""
        if out is None:
            return None, None, _batch_labels(batch, label_names)
        if isinstance(out, Mapping):
            if any(_is_metric(v) for v in out.values()):
                metrics.update({k: v for k, v in out.items() if _is_metric(v)})
                out = {k: v for k, v in out.items() if not _is_metric(v)}
            logits = out.get("logits", out.get("predictions"))
            lab = out.get("labels", _batch_labels(batch, label_names))
            loss = out.get("loss")
            if self.stage == "predict" and logits is None:
                logits = {k: v for k, v in out.items() if k != "loss"}
            return loss, logits, lab
        if isinstance(out, torch.Tensor):
            if self.stage == "predict":
                return None, out, _batch_labels(batch, label_names)
            if out.numel() == 1:
                return out, None, _batch_labels(batch, label_names)
        if self.stage == "predict":
            return None, out, _batch_labels(batch, label_names)
        raise TypeError(f"{self.stage} step returned {type(out).__name__}; return None, a scalar loss tensor or a "
                        "dict with 'loss', 'logits' and 'labels'.")


def _as_tensors(value: Any) -> Any:
    """Gathered numpy outputs (possibly nested) back as tensors, as HF's batch metrics receive them."""
    if isinstance(value, (list, tuple)):
        return type(value)(_as_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_tensors(v) for k, v in value.items()}
    return torch.as_tensor(value) if value is not None else None
