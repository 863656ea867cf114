"""The evaluation stages of ``Fit`` (F-EVAL-1..3): ``validate``/``evaluate``, ``test`` and ``predict``, each a run
of its own (:mod:`taskfit.run`) on the evaluation loop. Mirrors Lightning's ``Trainer.validate/test/predict`` and
HF ``Trainer.evaluate/predict``. A mixin of :class:`taskfit.Fit`: it reads the Fit's configuration and calls its
run helpers (``_launch``, ``_resolve_model``, ``_setup_run``, ``_loader``, ``_run_eval``, ``_log``)."""

from __future__ import annotations

import time
from typing import Any, Callable

from torch import nn

from taskfit import efficiency
from taskfit.data.loaders import DataModule
from taskfit.loops.evaluation_loop import EvaluationLoop
from taskfit.metrics import PredictionOutput
from taskfit.module import TaskModule, infer_batch_size
from taskfit.results import ResultCollection
from taskfit.run import Run


class EvaluationStages:
    """``validate``/``evaluate``, ``test`` and ``predict`` of :class:`taskfit.Fit`."""

    args: Any
    strategy: Any
    eval_dataset: Any
    _run: Any
    _last_fit: Any
    _hooks: Any
    _model_preparation_time: float | None

    def _eval_entry(self, model: Any, data: Any, stage: str, ckpt_path: str | None = None) -> tuple[TaskModule, Any]:
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model  # HF-style fit.evaluate(eval_dataset)
        self.strategy.configure(self.args)
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
            from taskfit.ckpt_path import load_ckpt_path

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
                 ckpt_path: str | None = None) -> dict[str, float]:
        """Evaluate on ``data`` (default: the eval data given to ``fit``); returns metrics such as
        ``eval_loss``, logged names (``val_acc``), ``compute_metrics`` results, ``eval_runtime`` (s),
        ``eval_samples_per_second``. A dict of datasets gives ``{prefix}_{name}_{metric}`` keys. ``ckpt_path``
        (``"best"``, ``"last"`` or a checkpoint folder; Lightning's argument) loads those weights first.

        Raises:
            ValueError: no data, empty data, a module without ``validation_step``, or no checkpoint for
                ``ckpt_path``.
        """
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model  # HF-style fit.evaluate(eval_dataset)
        return self._launch("validate", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                    metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path))

    def _validate_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                        metric_key_prefix: str, ckpt_path: str | None = None) -> dict[str, float]:
        module, data = self._eval_entry(model, data, "validate", ckpt_path)
        data = data if data is not None else self._from_datamodule(datamodule, "validate", "val_dataloader")
        fit_loaders = self._last_fit.eval_loaders if self._last_fit is not None else {}
        loaders = self._eval_loader_dict(data, data_collator) if data is not None else fit_loaders
        if not loaders and self.eval_dataset is not None:  # HF Trainer(eval_dataset=...) before any training
            loaders = self._eval_loader_dict(self.eval_dataset, data_collator)
        if not loaders:
            raise ValueError("validate() needs eval data: pass data, a datamodule, or eval_data to fit().")
        metrics, hidden = self._run_eval(loaders, "validate", metric_key_prefix)
        metrics["epoch"] = self.state.epoch  # HF's log() adds it to the returned dict too
        self._log({k: v for k, v in metrics.items() if k not in hidden})
        self._hooks.call_hf("on_evaluate", self.args, self.state, self.control, metrics=metrics)
        return metrics

    def evaluate(self, model: Any = None, data: Any = None, *, eval_dataset: Any = None,
                 **kwargs: Any) -> dict[str, float]:
        """HF-style alias of :meth:`validate`; ``fit.evaluate(eval_dataset)`` and ``eval_dataset=`` work too."""
        return self.validate(model, data if data is not None else eval_dataset, **kwargs)

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
        data = data if data is not None else self._from_datamodule(datamodule, "test", "test_dataloader")
        if data is None:
            raise ValueError("test() needs data: pass data or a datamodule with test_dataloader().")
        metrics, hidden = self._run_eval(self._eval_loader_dict(data, data_collator), "test", metric_key_prefix)
        self._log({k: v for k, v in metrics.items() if k not in hidden})
        return metrics

    def predict(self, model: nn.Module | None = None, data: Any = None, *, data_collator: Callable | None = None,
                datamodule: DataModule | None = None, metric_key_prefix: str = "test",
                test_dataset: Any = None, ckpt_path: str | None = None) -> PredictionOutput:
        """Run ``predict_step`` over ``data``; returns ``PredictionOutput(predictions, label_ids, metrics)``
        with numpy arrays concatenated over batches (mirrors HF ``Trainer.predict``; ``ckpt_path`` as in
        :meth:`validate`).

        Raises:
            ValueError: no or empty data.
        """
        data = data if data is not None else test_dataset
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model
        return self._launch("predict", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                   metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path))

    def _predict_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                       metric_key_prefix: str, ckpt_path: str | None = None) -> PredictionOutput:
        module, data = self._eval_entry(model, data, "predict", ckpt_path)
        data = data if data is not None else self._from_datamodule(datamodule, "predict", "predict_dataloader")
        if data is None:
            raise ValueError("predict() needs data: pass data or a datamodule with predict_dataloader().")
        loader = self._loader(data, train=False, collator=data_collator, what="predict dataset")
        metrics, preds, labels = EvaluationLoop(self, "predict", self._hooks).run(loader, metric_key_prefix)
        if self._model_preparation_time is not None:
            metrics[f"{metric_key_prefix}_model_preparation_time"] = self._model_preparation_time
        self._hooks.call_hf("on_predict", self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(preds, labels, metrics)
