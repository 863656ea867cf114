"""The evaluation loop behind ``Fit.validate``/``test``/``predict`` (F-EVAL-1, F-EVAL-2 single process)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from taskfit.metrics import EvalPrediction, nested_concat, speed_metrics, to_numpy
from taskfit.module import infer_batch_size
from taskfit.results import ResultCollection

if TYPE_CHECKING:
    from taskfit.fit import Fit

_PREFIXES = ("val_", "eval_", "test_")


def metric_key(name: str, prefix: str) -> str:
    """``name`` if it already carries a stage prefix (``val_``, ``eval_``, ``test_``, ``{prefix}_``), else
    ``{prefix}_{name}`` (HF's ``metric_key_prefix`` rule)."""
    return name if name.startswith(_PREFIXES + (f"{prefix}_",)) else f"{prefix}_{name}"


def _batch_labels(batch: Any, label_names: list[str]) -> Any:
    if isinstance(batch, Mapping):
        found = [batch[k] for k in label_names if k in batch]
        return (found[0] if len(found) == 1 else tuple(found)) if found else None
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return batch[-1]
    return None


def _batch_inputs(batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return batch.get("input_ids", next(iter(batch.values()), None))
    if isinstance(batch, (list, tuple)):
        return batch[0]
    return batch


class _Collector:
    """Keeps per-batch tensors on the device and moves them to host numpy every ``flush_every`` batches
    (``eval_accumulation_steps``; None = once at the end)."""

    def __init__(self, flush_every: int | None) -> None:
        self.flush_every = flush_every
        self.device_items: list[Any] = []
        self.host_items: list[Any] = []

    def add(self, item: Any) -> None:
        if item is None:
            return
        self.device_items.append(item)
        if self.flush_every and len(self.device_items) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        self.host_items.extend(to_numpy(x) for x in self.device_items)
        self.device_items = []

    def result(self, concat: bool) -> Any:
        self.flush()
        if not self.host_items:
            return None
        return nested_concat(self.host_items) if concat else self.host_items


class EvaluationLoop:
    """Run one pass over a loader in evaluation mode.

    Args:
        fit (Fit): the run (module, strategy, hooks, arguments, metric functions).
        stage (str): ``"validate"``, ``"test"`` or ``"predict"``.
    """

    def __init__(self, fit: Fit, stage: str) -> None:
        self.fit, self.stage = fit, stage
        self.hidden: set[str] = set()

    def run(self, loader: Any, prefix: str) -> tuple[dict[str, float], Any, Any]:
        """Evaluate every batch of ``loader``; returns ``(metrics, predictions, label_ids)``.

        Predictions and labels are numpy arrays concatenated over batches (padded with -100 where sequence
        lengths differ), collected in ``predict`` and, for other stages, when ``compute_metrics`` is set and
        ``prediction_loss_only`` is False.

        Raises:
            TypeError: a step returned something that is neither None, a tensor nor a dict.
        """
        fit, stage = self.fit, self.stage
        module, strategy, args, hooks = fit.module, fit.strategy, fit.args, fit._hooks
        step_fn = {"validate": module.validation_step, "test": module.test_step,
                   "predict": module.predict_step}[stage]
        hook_stage = "validation" if stage == "validate" else stage
        compute_metrics = fit.compute_metrics
        collect = not args.prediction_loss_only and (stage == "predict" or compute_metrics is not None)
        preprocess = fit.preprocess_logits_for_metrics
        label_names = args.label_names or getattr(module, "label_names", None) or ["labels"]

        was_training = module.training
        module.eval()
        prev_results, prev_defaults = module._results, module._log_defaults
        results = module._results = ResultCollection(infer_batch_size, strategy.reduce)
        module._log_defaults = (False, True)
        preds, labels, inputs = (_Collector(args.eval_accumulation_steps) for _ in range(3))
        loss_sum, n_samples, n_batches, batch_metrics = None, 0, 0, None
        try:
            fit.num_eval_batches = len(loader) if hasattr(loader, "__len__") else None
        except TypeError:
            fit.num_eval_batches = None
        try:
            start = time.perf_counter()
            hooks.call(f"on_{hook_stage}_start", fit, module)
            hooks.call(f"on_{hook_stage}_epoch_start", fit, module)
            with torch.no_grad():
                for batch_idx, batch in enumerate(loader):
                    batch = strategy.batch_to_device(batch)
                    results.set_batch(batch)
                    bs = infer_batch_size(batch)
                    hooks.call(f"on_{hook_stage}_batch_start", fit, module, batch, batch_idx)
                    with strategy.forward_context():
                        out = step_fn(batch, batch_idx)
                    loss, logits, lab = self._unpack(out, batch, label_names)
                    if loss is not None:
                        loss_sum = loss.detach().float() * bs if loss_sum is None else loss_sum + loss.detach().float() * bs
                    if collect:
                        if preprocess is not None and stage != "predict":
                            logits = preprocess(logits, lab)
                        preds.add(logits)
                        labels.add(lab)
                        if args.include_inputs_for_metrics:
                            inputs.add(_batch_inputs(batch))
                        if args.batch_eval_metrics and compute_metrics is not None and stage != "predict":
                            batch_metrics = compute_metrics(
                                EvalPrediction(to_numpy(logits), to_numpy(lab),
                                               to_numpy(_batch_inputs(batch)) if args.include_inputs_for_metrics else None),
                                compute_result=batch_idx + 1 == fit.num_eval_batches)
                            preds.device_items.clear(), labels.device_items.clear(), inputs.device_items.clear()
                    n_samples += bs
                    n_batches += 1
                    hooks.call(f"on_{hook_stage}_batch_end", fit, module, out, batch, batch_idx)
                    if hooks.hf["on_prediction_step"]:
                        hooks.call_hf("on_prediction_step", args, fit.state, fit.control)
            concat = args.eval_do_concat_batches
            all_preds, all_labels = preds.result(concat), labels.result(concat)
            all_inputs = inputs.result(concat) if args.include_inputs_for_metrics else None

            metrics = {metric_key(k, prefix): v for k, v in results.epoch_values(logger_only=False).items()}
            self.hidden = {metric_key(k, prefix) for k in results.hidden_names()}  # logger=False: not sent to loggers
            results.reset_epoch()  # logged torchmetrics objects start fresh at the next evaluation
            if loss_sum is not None:
                metrics[f"{prefix}_loss"] = float(strategy.reduce(loss_sum, "sum")) / max(1, n_samples)
            if compute_metrics is not None and (stage != "predict" or all_labels is not None):
                if args.batch_eval_metrics and stage != "predict":
                    extra = batch_metrics or {}
                elif all_preds is not None:
                    extra = compute_metrics(EvalPrediction(all_preds, all_labels, all_inputs))
                else:
                    extra = {}
                metrics.update({metric_key(k, prefix): float(v) if isinstance(v, (int, float)) else v
                                for k, v in (extra or {}).items()})
            metrics.update(speed_metrics(prefix, start, time.perf_counter(), n_samples, n_batches))
            fit.callback_metrics.update(metrics)
            hooks.call(f"on_{hook_stage}_epoch_end", fit, module)
            hooks.call(f"on_{hook_stage}_end", fit, module)
        finally:  # an exception inside a step must not leave the module in eval mode or with eval results
            module._results, module._log_defaults = prev_results, prev_defaults
            if was_training:
                module.train()
        return metrics, all_preds, all_labels

    def _unpack(self, out: Any, batch: Any, label_names: list[str]) -> tuple[Any, Any, Any]:
        """``(loss, predictions, labels)`` from a step's return value."""
        if out is None:
            return None, None, _batch_labels(batch, label_names)
        if isinstance(out, Mapping):
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
