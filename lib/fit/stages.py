"""The evaluation stages of ``Fit`` (F-EVAL-1..3): ``validate``/``evaluate``, ``test`` and ``predict``, each a run
of its own (:mod:`taskfit.fit.run`) on the evaluation loop. Mirrors Lightning's ``Trainer.validate/test/predict`` and
HF ``Trainer.evaluate/predict``. A mixin of :class:`taskfit.Fit`: it reads the Fit's configuration and calls its
run helpers (``_launch``, ``_resolve_model``, ``_setup_run``, ``_loader``, ``_run_eval``, ``_log``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Callable

from torch import nn

from taskfit import efficiency
from taskfit.connector import configure_strategy
from taskfit.data.loaders import DataModule
from taskfit.fit.hf_overrides import hf_overrides
from taskfit.loops.evaluation_loop import EvaluationLoop
from taskfit.metrics import PredictionOutput
from taskfit.core.module import TaskModule, infer_batch_size
from taskfit.core.hooks import module_loader
from taskfit.core.results import ResultCollection
from taskfit.fit.run import Run
from taskfit.core.wrapping import ModelTaskModule


def _hf_positional(model: Any, data: Any, ignore_keys: Any) -> tuple[Any, Any, Any]:
    """``(model, data, ignore_keys)`` from Fit-style ``(model, data)`` or HF-style ``(dataset, ignore_keys)``
    positional arguments: a first argument that is no module is the dataset, and a list of strings after it is
    ``ignore_keys``."""
    if model is not None and not isinstance(model, nn.Module):
        if data is None:
            return None, model, ignore_keys
        if isinstance(data, (list, tuple)) and data and all(isinstance(k, str) for k in data):
            return None, model, list(data)
    return model, data, ignore_keys


class EvaluationStages:
    """``validate``/``evaluate``, ``test`` and ``predict`` of :class:`taskfit.Fit`."""

    args: Any
    strategy: Any
    eval_dataset: Any
    _run: Any
    _last_fit: Any
    _hooks: Any
    _model_preparation_time: float | None
    _eval_in_progress: bool = False  # an HF-style evaluate() recursion runs inside the current stage

    def _eval_entry(self, model: Any, data: Any, stage: str, ckpt_path: str | None = None) -> tuple[TaskModule, Any]:
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model  # HF-style fit.evaluate(eval_dataset)
        configure_strategy(self.strategy, self.args)
        self.strategy.setup_environment()
        model, module = self._resolve_model(model, stage)
        last = self._run
        state, control = (last.state, last.control) if last is not None else (self._idle_state, self._idle_control)
        run = Run(stage, model, module, state, control)
        start = time.perf_counter()
        self._setup_run(run)
        if self._last_fit is None and self._model_preparation_time is None:
            # HF: the model was first prepared for evaluation; every later eval/predict reports the time
            self._model_preparation_time = round(time.perf_counter() - start, 4)
        self._run = run
        if ckpt_path is not None:  # Lightning's ckpt_path: score those weights
            from taskfit.fit.ckpt_path import load_ckpt_path

            load_ckpt_path(self, run, ckpt_path)
        efficiency.prepare_full_eval(self, module)  # fp16_full_eval / bf16_full_eval
        if module._results is None:
            module._results = ResultCollection(infer_batch_size, self.strategy.reduce)
        if stage in ("validate", "test") and not self._can_validate(module) and (
                type(module).test_step is TaskModule.test_step):
            raise ValueError(f"{type(module).__name__} has no {stage.replace('validate', 'validation')}_step "
                             "to evaluate with.")
        return module, data

    def _from_datamodule(self, datamodule: DataModule | None, stage: str, method: str) -> Any:
        if datamodule is None:
            return None
        datamodule.prepare_data()
        datamodule.setup(stage)
        return getattr(datamodule, method)()

    def validate(self, model: nn.Module | None = None, data: Any = None, *, data_collator: Callable | None = None,
                 datamodule: DataModule | None = None, metric_key_prefix: str = "eval",
                 ckpt_path: str | None = None, ignore_keys: list[str] | None = None) -> dict[str, float]:
        """Evaluate on ``data`` (default: the eval data given to ``fit``); returns metrics such as
        ``eval_loss``, logged names (``val_acc``), ``compute_metrics`` results, ``eval_runtime`` (s),
        ``eval_samples_per_second``. A dict of datasets gives ``{prefix}_{name}_{metric}`` keys. ``ckpt_path``
        (``"best"``, ``"last"`` or a checkpoint folder; Lightning's argument) loads those weights first.
        ``ignore_keys``: output keys of a plain model left out of the predictions (HF's argument).

        Raises:
            ValueError: no data, empty data, a module without ``validation_step``, or no checkpoint for
                ``ckpt_path``.
        """
        model, data, ignore_keys = _hf_positional(model, data, ignore_keys)  # HF-style fit.evaluate(eval_dataset)
        return self._launch("validate", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                    metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path,
                                                    ignore_keys=ignore_keys))

    def _validate_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                        metric_key_prefix: str, ckpt_path: str | None = None,
                        ignore_keys: list[str] | None = None) -> dict[str, float]:
        module, data = self._eval_entry(model, data, "validate", ckpt_path)
        data = data if data is not None else (self._from_datamodule(datamodule, "validate", "val_dataloader")
                                              if datamodule is not None else module_loader(module, "val_dataloader"))
        if isinstance(module, ModelTaskModule) and hf_overrides(self, "get_eval_dataloader"):
            if data is None and self.eval_dataset is None and self._last_fit is not None:
                data = self._last_fit.eval_data
            self._eval_in_progress = True  # HF's evaluate() body; its dict recursion stays in this stage
            try:
                with self._loader_context(self._run, data_collator=data_collator):
                    return self._hf_evaluate(data, ignore_keys, metric_key_prefix)
            finally:
                self._eval_in_progress = False
        fit_loaders = self._last_fit.eval_loaders if self._last_fit is not None else {}
        loaders = self._eval_loader_dict(data, data_collator) if data is not None else fit_loaders
        if not loaders and self.eval_dataset is not None:  # HF Trainer(eval_dataset=...) before any training
            loaders = self._eval_loader_dict(self.eval_dataset, data_collator)
        if not loaders:
            raise ValueError("validate() needs eval data: pass data, a datamodule, or eval_data to fit().")
        return self._evaluate_in_run(loaders, metric_key_prefix, ignore_keys)

    def _evaluate_in_run(self, loaders: dict[str | None, Any], prefix: str,
                         ignore_keys: list[str] | None) -> dict[str, float]:
        """Evaluate ``loaders`` on the current run, log the row and call ``on_evaluate`` (HF ``evaluate``'s end).
        A plain model's named loaders (a dict of eval datasets) are evaluated one by one with prefix
        ``{prefix}_{name}``, each logging its own row and calling ``on_evaluate``, as HF's ``evaluate`` does for a
        dict; a TaskModule's give one row with every set's metrics."""
        if len(loaders) > 1 and all(isinstance(n, str) for n in loaders) and isinstance(self._run.module,
                                                                                       ModelTaskModule):
            merged: dict[str, float] = {}
            for name, loader in loaders.items():
                merged.update(self._evaluate_in_run({None: loader}, f"{prefix}_{name}", ignore_keys))
            return merged
        metrics, hidden = self._run_eval(loaders, "validate", prefix, ignore_keys)
        row = metrics if not hidden else {k: v for k, v in metrics.items() if k not in hidden}
        # HF: log(metrics) adds the epoch to the very dict evaluate() returns (a log override sees the row
        # without it, and one that logs a copy leaves the returned dict without it)
        self._log(row)
        if row is not metrics and "epoch" in row:
            metrics["epoch"] = row["epoch"]
        self._hooks.call_hf("on_evaluate", self.args, self.state, self.control, metrics=metrics)
        return metrics

    def _hf_evaluate(self, eval_dataset: Any, ignore_keys: list[str] | None, prefix: str) -> dict[str, float]:
        """HF ``Trainer.evaluate``'s body on the current run: a dict of datasets evaluates each through
        ``self.evaluate`` (``{prefix}_{name}`` keys, one log row each), else :meth:`get_eval_dataloader`."""
        override = eval_dataset is not None
        data = eval_dataset if override else self.eval_dataset
        if isinstance(data, Mapping):
            metrics: dict[str, float] = {}
            for name, d in data.items():
                metrics.update(self.evaluate(eval_dataset=d if override else name, ignore_keys=ignore_keys,
                                             metric_key_prefix=f"{prefix}_{name}"))
            return metrics
        return self._evaluate_in_run({None: self.get_eval_dataloader(data)}, prefix, ignore_keys)  # as HF: the data

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", *, model: Any = None, data: Any = None,
                 **kwargs: Any) -> dict[str, float]:
        """Evaluate and return the metrics (HF ``Trainer.evaluate(eval_dataset, ignore_keys, metric_key_prefix)``);
        outside training :meth:`validate` (``fit.evaluate(model, data)`` and its keywords work too); called while
        training (by the loop, a callback or an override) it evaluates inside that run, as HF's does. A subclass
        override is what the evaluations during training call (as HF's ``_maybe_log_save_evaluate``)."""
        if isinstance(eval_dataset, nn.Module):  # Fit-style evaluate(model, data)
            model, eval_dataset, ignore_keys = eval_dataset, ignore_keys if data is None else data, None
        data = data if data is not None else eval_dataset
        if self.is_in_train or self._eval_in_progress:
            return self._hf_evaluate(data, ignore_keys, metric_key_prefix)
        return self.validate(model, data, metric_key_prefix=metric_key_prefix, ignore_keys=ignore_keys, **kwargs)

    def test(self, model: nn.Module | None = None, data: Any = None, *, data_collator: Callable | None = None,
             datamodule: DataModule | None = None, metric_key_prefix: str = "test",
             ckpt_path: str | None = None) -> dict[str, float]:
        """Like :meth:`validate` with ``test_step`` and ``test_`` keys (``ckpt_path`` as there).

        Raises:
            ValueError: no or empty data.
        """
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model
        return self._launch("test", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path))

    def _test_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                    metric_key_prefix: str, ckpt_path: str | None = None) -> dict[str, float]:
        module, data = self._eval_entry(model, data, "test", ckpt_path)
        data = data if data is not None else (self._from_datamodule(datamodule, "test", "test_dataloader")
                                              if datamodule is not None else module_loader(module, "test_dataloader"))
        if data is None:
            raise ValueError("test() needs data: pass data or a datamodule with test_dataloader().")
        metrics, hidden = self._run_eval(self._eval_loader_dict(data, data_collator), "test", metric_key_prefix)
        self._log({k: v for k, v in metrics.items() if k not in hidden})
        return metrics

    def predict(self, test_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                *, model: nn.Module | None = None, data: Any = None, data_collator: Callable | None = None,
                datamodule: DataModule | None = None, ckpt_path: str | None = None) -> PredictionOutput:
        """Run ``predict_step`` over ``data``; returns ``PredictionOutput(predictions, label_ids, metrics)``
        with numpy arrays concatenated over batches (mirrors HF ``Trainer.predict``; ``ckpt_path`` as in
        :meth:`validate`). HF's signature ``predict(test_dataset, ignore_keys, metric_key_prefix)``; Fit's
        ``predict(model, data)`` and ``model=``/``data=`` keywords work too. A plain model's
        run builds its loader with :meth:`get_test_dataloader` and applies ``preprocess_logits_for_metrics``, as HF.

        Raises:
            ValueError: no or empty data.
        """
        if isinstance(test_dataset, nn.Module):  # Fit-style predict(model, data)
            model, test_dataset, ignore_keys = test_dataset, ignore_keys if data is None else data, None
        data = data if data is not None else test_dataset
        return self._launch("predict", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                   metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path,
                                                   ignore_keys=ignore_keys))

    def _predict_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                       metric_key_prefix: str, ckpt_path: str | None = None,
                       ignore_keys: list[str] | None = None) -> PredictionOutput:
        module, data = self._eval_entry(model, data, "predict", ckpt_path)
        data = data if data is not None else (self._from_datamodule(datamodule, "predict", "predict_dataloader")
                                              if datamodule is not None else module_loader(module, "predict_dataloader"))
        if data is None:
            raise ValueError("predict() needs data: pass data or a datamodule with predict_dataloader().")
        if isinstance(module, ModelTaskModule) and hf_overrides(self, "get_test_dataloader"):
            with self._loader_context(self._run, data_collator=data_collator):
                loader = self.get_test_dataloader(data)
        else:
            loader = self._loader(data, train=False, collator=data_collator, what="predict dataset")
        loop = EvaluationLoop(self, "predict", self._hooks, ignore_keys)
        metrics, preds, labels = loop.run(loader, metric_key_prefix)
        if self._model_preparation_time is not None:
            metrics[f"{metric_key_prefix}_model_preparation_time"] = self._model_preparation_time
        self._hooks.call_hf("on_predict", self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(preds, labels, metrics)
