"""The evaluation stages of ``Fit`` (F-EVAL-1..3): the bodies of ``validate``/``evaluate``, ``test`` and
``predict``, each a run of its own (:mod:`taskfit.fit.run`) on the evaluation loop. Mirrors Lightning's
``Trainer.validate/test/predict`` and HF ``Trainer.evaluate/predict``. An object owned by :class:`taskfit.Fit`: it
reads the Fit's configuration, uses its launcher for runs and loaders, and calls the Fit's public methods (``log``,
``evaluate``, ``get_*_dataloader``) through the Fit, so a subclass's overrides are what runs."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Callable

from torch import nn

from taskfit import efficiency
from taskfit.arguments.strategy_options import StrategyOptions
from taskfit.connector import configure_strategy
from taskfit.data.loaders import DataModule
from taskfit.loops.evaluation_loop import EvaluationLoop, is_loader_list
from taskfit.metrics import PredictionOutput
from taskfit.core.module import TaskModule, infer_batch_size
from taskfit.core.hooks import module_loader
from taskfit.core.results import ResultCollection
from taskfit.fit.run import Run
from taskfit.core.wrapping import ModelTaskModule


# each stage's loader method of a datamodule or module (Lightning's names)
_LOADER_METHODS = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}


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
    """The stage bodies of ``validate``/``evaluate``, ``test`` and ``predict`` of one :class:`taskfit.Fit`.

    Args:
        fit (Fit): the owner.

    Attributes:
        eval_in_progress (bool): an HF-style ``evaluate()`` recursion runs inside the current stage.
        model_preparation_time (float | None): seconds the first evaluation's set-up took (HF reports it as
            ``{prefix}_model_preparation_time`` when the model was first prepared for evaluation).
    """

    def __init__(self, fit: Any) -> None:
        self.fit = fit
        self.eval_in_progress = False
        self.model_preparation_time: float | None = None

    @staticmethod
    def can_validate(module: TaskModule) -> bool:
        """True when ``module`` overrides ``validation_step`` (and did not set it to None on the instance)."""
        from taskfit.core.step_call import step_disabled

        return type(module).validation_step is not TaskModule.validation_step and \
            not step_disabled(module, "validation_step")

    def eval_entry(self, model: Any, data: Any, stage: str, ckpt_path: str | None = None) -> tuple[TaskModule, Any]:
        """Start an evaluation run of ``stage``: the model, the run (sharing the last run's state), its set-up on
        the strategy and ``ckpt_path``'s weights. Returns the module and the data.

        Raises:
            ValueError: a module without ``validation_step``/``test_step``; no checkpoint for ``ckpt_path``.
        """
        fit = self.fit
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model  # HF-style fit.evaluate(eval_dataset)
        configure_strategy(fit.strategy, StrategyOptions.from_arguments(fit.args))
        fit.strategy.setup_environment()
        model, module = fit._launcher.resolve_model(model, stage)
        last = fit._run
        state, control = (last.state, last.control) if last is not None else (fit._idle_state, fit._idle_control)
        run = Run(stage, model, module, state, control)
        start = time.perf_counter()
        fit._launcher.setup_run(run)
        if fit._last_fit is None and self.model_preparation_time is None:
            # HF: the model was first prepared for evaluation; every later eval/predict reports the time
            self.model_preparation_time = round(time.perf_counter() - start, 4)
        fit._run = run
        if ckpt_path is not None:  # Lightning's ckpt_path: score those weights
            from taskfit.fit.ckpt_path import load_ckpt_path

            load_ckpt_path(fit, run, ckpt_path)
        efficiency.prepare_full_eval(fit, module)  # fp16_full_eval / bf16_full_eval
        if module._results is None:
            module._results = ResultCollection(infer_batch_size, fit.strategy.reduce)
        if stage in ("validate", "test") and not self.can_validate(module) and (
                type(module).test_step is TaskModule.test_step):
            raise ValueError(f"{type(module).__name__} has no {stage.replace('validate', 'validation')}_step "
                             "to evaluate with.")
        return module, data

    @staticmethod
    def from_datamodule(datamodule: DataModule | None, stage: str, method: str) -> Any:
        """``datamodule.<method>()`` after its ``prepare_data``/``setup(stage)``; None without a datamodule."""
        if datamodule is None:
            return None
        datamodule.prepare_data()
        datamodule.setup(stage=stage)  # by keyword, as Lightning calls it
        return getattr(datamodule, method)()

    def stage_entry(self, model: Any, data: Any, datamodule: DataModule | None, stage: str,
                    ckpt_path: str | None, required: bool) -> tuple[TaskModule, Any]:
        """:meth:`eval_entry`, then the stage's data: ``data``, else ``datamodule``'s loader of the stage (after its
        ``prepare_data``/``setup``), else the module's own (Lightning's ``val/test/predict_dataloader`` order).

        Raises:
            ValueError: ``required`` and no data from any of the three.
        """
        module, data = self.eval_entry(model, data, stage, ckpt_path)
        method = _LOADER_METHODS[stage]
        if data is None:
            data = (self.from_datamodule(datamodule, stage, method) if datamodule is not None
                    else module_loader(module, method))
        if data is None and required:
            raise ValueError(f"{stage}() needs data: pass data or a datamodule with {method}().")
        return module, data

    def validate_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                       metric_key_prefix: str, ckpt_path: str | None = None,
                       ignore_keys: list[str] | None = None) -> dict[str, float]:
        """The body of ``Fit.validate`` on this process (see there).

        Raises:
            ValueError: no eval data.
        """
        fit = self.fit
        module, data = self.stage_entry(model, data, datamodule, "validate", ckpt_path, required=False)
        if isinstance(module, ModelTaskModule) and fit._hf.overrides("get_eval_dataloader"):
            if data is None and fit.eval_dataset is None and fit._last_fit is not None:
                data = fit._last_fit.eval_data
            self.eval_in_progress = True  # HF's evaluate() body; its dict recursion stays in this stage
            try:
                with fit._hf.loader_context(fit._run, data_collator=data_collator):
                    return self.hf_evaluate(data, ignore_keys, metric_key_prefix)
            finally:
                self.eval_in_progress = False
        fit_loaders = fit._last_fit.eval_loaders if fit._last_fit is not None else {}
        loaders = fit._launcher.eval_loader_dict(data, data_collator) if data is not None else fit_loaders
        if not loaders and fit.eval_dataset is not None:  # HF Trainer(eval_dataset=...) before any training
            loaders = fit._launcher.eval_loader_dict(fit.eval_dataset, data_collator)
        if not loaders:
            raise ValueError("validate() needs eval data: pass data, a datamodule, or eval_data to fit().")
        return self.evaluate_in_run(loaders, metric_key_prefix, ignore_keys)

    def evaluate_in_run(self, loaders: dict[str | None, Any], prefix: str,
                        ignore_keys: list[str] | None) -> dict[str, float]:
        """Evaluate ``loaders`` on the current run, log the row and call ``on_evaluate`` (HF ``evaluate``'s end).
        A plain model's named loaders (a dict of eval datasets) are evaluated one by one with prefix
        ``{prefix}_{name}``, each logging its own row and calling ``on_evaluate``, as HF's ``evaluate`` does for a
        dict; a TaskModule's give one row with every set's metrics."""
        fit = self.fit
        if len(loaders) > 1 and all(isinstance(n, str) for n in loaders) and isinstance(fit._run.module,
                                                                                       ModelTaskModule):
            merged: dict[str, float] = {}
            for name, loader in loaders.items():
                merged.update(self.evaluate_in_run({None: loader}, f"{prefix}_{name}", ignore_keys))
            return merged
        metrics, hidden = self.run_eval(loaders, "validate", prefix, ignore_keys)
        row = metrics if not hidden else {k: v for k, v in metrics.items() if k not in hidden}
        # HF: log(metrics) adds the epoch to the very dict evaluate() returns (a log override sees the row
        # without it, and one that logs a copy leaves the returned dict without it)
        fit.log(row)  # through the Fit: a subclass's log() override sees every row, as in HF
        for key in ("epoch", "num_input_tokens_seen") if row is not metrics else ():
            if key in row:
                metrics[key] = row[key]
        fit.control.should_evaluate = False  # as HF's on_evaluate: a checkpoint saved after it records False
        fit._hooks.call_hf("on_evaluate", fit.args, fit.state, fit.control, metrics=metrics)
        return metrics

    def hf_evaluate(self, eval_dataset: Any, ignore_keys: list[str] | None, prefix: str) -> dict[str, float]:
        """HF ``Trainer.evaluate``'s body on the current run: a dict of datasets evaluates each through
        ``fit.evaluate`` (``{prefix}_{name}`` keys, one log row each), else ``fit.get_eval_dataloader``."""
        fit = self.fit
        override = eval_dataset is not None
        data = eval_dataset if override else fit.eval_dataset
        if isinstance(data, Mapping):
            metrics: dict[str, float] = {}
            for name, d in data.items():
                metrics.update(fit.evaluate(eval_dataset=d if override else name, ignore_keys=ignore_keys,
                                            metric_key_prefix=f"{prefix}_{name}"))
            return metrics
        return self.evaluate_in_run({None: fit.get_eval_dataloader(data)}, prefix, ignore_keys)  # as HF: the data

    def run_eval(self, loaders: dict[str | None, Any], stage: str, prefix: str,
                 ignore_keys: list[str] | None = None) -> tuple[dict, set[str]]:
        """Evaluate every named loader; returns the metrics and the keys logged with ``logger=False``."""
        fit = self.fit
        metrics: dict[str, float] = {}
        hidden: set[str] = set()
        indexed = len(loaders) > 1 and all(isinstance(n, int) for n in loaders)  # a list: one evaluation epoch
        shared = ResultCollection(infer_batch_size, fit.strategy.reduce, sync_by_default=True) if indexed else None
        for i, (name, loader) in enumerate(loaders.items()):
            loop = EvaluationLoop(fit, stage, fit._hooks, ignore_keys, **(dict(
                dataloader_idx=name, results=shared, first=i == 0, last=i == len(loaders) - 1) if indexed else {}))
            key = prefix if name is None or indexed else f"{prefix}_{name}"
            metrics.update(loop.run(loader, key)[0])
            if self.model_preparation_time is not None:
                metrics[f"{key}_model_preparation_time"] = self.model_preparation_time
            hidden |= loop.hidden
        return metrics, hidden

    def test_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                   metric_key_prefix: str, ckpt_path: str | None = None) -> dict[str, float]:
        """The body of ``Fit.test`` on this process.

        Raises:
            ValueError: no data.
        """
        fit = self.fit
        _, data = self.stage_entry(model, data, datamodule, "test", ckpt_path, required=True)
        metrics, hidden = self.run_eval(fit._launcher.eval_loader_dict(data, data_collator), "test",
                                        metric_key_prefix)
        fit.log({k: v for k, v in metrics.items() if k not in hidden})
        return metrics

    def _predict_loaders(self, loaders: dict[int, Any], prefix: str,
                         ignore_keys: list[str] | None) -> PredictionOutput:
        """Predict over several loaders as one prediction epoch (Lightning's ``dataloader_idx``); the predictions
        and labels are lists with one entry per loader."""
        fit, metrics, preds, labels = self.fit, {}, [], []
        for i, loader in loaders.items():
            loop = EvaluationLoop(fit, "predict", fit._hooks, ignore_keys, dataloader_idx=i, first=i == 0,
                                  last=i == len(loaders) - 1)
            m, p, lab = loop.run(loader, prefix)
            metrics.update(m)
            preds.append(p)
            labels.append(lab)
        fit._hooks.call_hf("on_predict", fit.args, fit.state, fit.control, metrics=metrics)
        return PredictionOutput(preds, labels, metrics)

    def predict_stage(self, model: Any, data: Any, data_collator: Callable | None, datamodule: DataModule | None,
                      metric_key_prefix: str, ckpt_path: str | None = None,
                      ignore_keys: list[str] | None = None) -> PredictionOutput:
        """The body of ``Fit.predict`` on this process.

        Raises:
            ValueError: no data.
        """
        fit = self.fit
        module, data = self.stage_entry(model, data, datamodule, "predict", ckpt_path, required=True)
        if isinstance(module, ModelTaskModule) and fit._hf.overrides("get_test_dataloader"):
            with fit._hf.loader_context(fit._run, data_collator=data_collator):
                loader = fit.get_test_dataloader(data)
        elif is_loader_list(data) and len(data) > 1:  # Lightning's list of loaders: one pass each, indexed
            return self._predict_loaders(fit._launcher.eval_loader_dict(data, data_collator), metric_key_prefix,
                                         ignore_keys)
        else:
            loader = fit._launcher.loader(data, train=False, collator=data_collator, what="predict dataset")
        loop = EvaluationLoop(fit, "predict", fit._hooks, ignore_keys)
        metrics, preds, labels = loop.run(loader, metric_key_prefix)
        if self.model_preparation_time is not None:
            metrics[f"{metric_key_prefix}_model_preparation_time"] = self.model_preparation_time
        fit._hooks.call_hf("on_predict", fit.args, fit.state, fit.control, metrics=metrics)
        return PredictionOutput(preds, labels, metrics)
