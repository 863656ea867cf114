"""The HF ``Trainer`` override points of ``Fit`` (mirrors ``transformers.Trainer`` 5.x): ``get_train_dataloader``,
``get_eval_dataloader``, ``get_test_dataloader``, ``create_optimizer_and_scheduler``, ``create_optimizer``,
``create_scheduler``, ``training_step`` and ``prediction_step``, with HF's signatures and defaults. A subclass that
overrides one of them changes a run of a plain model (``Fit(model=..., args=...)``, ``taskfit.hf.Trainer``) where
HF's ``Trainer`` calls it: the loops call them through ``self``. A :class:`~taskfit.TaskModule` keeps its own
``training_step``/``validation_step``; the HF override points apply to plain models only.

Where they are called (as HF 5):

- ``get_train_dataloader()`` once per ``train()``; ``get_eval_dataloader(eval_dataset)`` by every ``evaluate``
  (also the evaluations during training), ``get_test_dataloader(test_dataset)`` by ``predict``.
- ``create_optimizer()`` then ``create_scheduler(num_training_steps=max_steps)`` once per ``train()``;
  ``create_optimizer_and_scheduler`` is not called by ``train()`` (as in HF 5, where it only calls the two).
- ``training_step(model, inputs, num_items_in_batch)`` per micro-batch: it computes the loss, runs backward and
  returns the detached loss (what the logged loss sums).
- ``prediction_step(model, inputs, prediction_loss_only, ignore_keys)`` per evaluation/prediction batch, returning
  ``(loss, logits, labels)``.

``model`` given to ``training_step``/``prediction_step`` is the user's model; under DDP/FSDP/DeepSpeed a view of it
whose call runs through the wrapper's forward (gradient sync, parameter gathering) and whose attributes are the
model's (HF passes the wrapper itself).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any, Iterator

import torch
from torch import nn

from taskfit.data.loaders import default_collate_with_labels
from taskfit.optim.hf_optimizers import fused_backward_of
from taskfit.core.wrapping import ModelTaskModule


def default_collator(data_collator: Any, processing_class: Any) -> Any:
    """``Trainer.data_collator`` as HF sets it (``transformers.Trainer.__init__``): ``data_collator`` when given,
    else ``DataCollatorWithPadding(processing_class)`` when ``processing_class`` is a tokenizer or a sequence
    feature extractor (a ``PreTrainedTokenizerBase`` / ``SequenceFeatureExtractor``), else taskfit's
    :func:`~taskfit.data.loaders.default_collate_with_labels` (HF's ``default_data_collator`` for dict samples:
    ``label``/``label_ids`` become ``labels``; tuple samples are stacked as torch's ``default_collate``)."""
    if data_collator is not None:
        return data_collator
    kinds = {c.__name__ for c in type(processing_class).__mro__} if processing_class is not None else set()
    if kinds & {"PreTrainedTokenizerBase", "SequenceFeatureExtractor"}:  # HF's rule, without importing transformers
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(processing_class)
    return default_collate_with_labels


class _EnginePlaceholder:
    """What ``Fit.optimizer`` / ``lr_scheduler`` hold while the override points run for a strategy
    that builds both itself (HF: accelerate's ``DummyOptim`` / ``DummyScheduler``)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what} built by the DeepSpeed engine>"


_PLACEHOLDER_OPTIMIZER = _EnginePlaceholder("optimizer")
_PLACEHOLDER_SCHEDULER = _EnginePlaceholder("LR scheduler")


class RoutedModel:
    """The user's model as an HF override point sees it under a wrapping strategy: calling it (``model(**inputs)``)
    runs the forward through the strategy's wrapper (DDP gradient hooks, FSDP/DeepSpeed parameter gathering);
    every attribute (``config``, ``parameters()``, ``train()``...) is the model's own.

    Args:
        model (nn.Module): the user's model.
        forward (Callable[[Any], Any]): the strategy's step function for ``ModelTaskModule.model_outputs``.
    """

    def __init__(self, model: nn.Module, forward: Any) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_forward", forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``model(**inputs)`` or ``model(*inputs)`` through the wrapper.

        Raises:
            TypeError: positional and keyword inputs mixed (the wrapper's step takes one of them).
        """
        if args and kwargs:
            raise TypeError(f"{type(self._model).__name__} under a wrapping strategy is called with keyword inputs "
                            "(model(**inputs)) or positional ones, not both.")
        if len(args) == 1 and isinstance(args[0], Mapping):
            return self._forward(args[0])
        return self._forward(tuple(args) if args else kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)


#: the HF override points a subclass of ``Fit`` may replace (plus ``evaluate``, which the evaluations during training
#: call through the Fit as HF's ``_maybe_log_save_evaluate`` does)
OVERRIDE_POINTS = ("get_train_dataloader", "get_eval_dataloader", "get_test_dataloader", "create_optimizer",
                   "create_scheduler", "create_optimizer_and_scheduler", "training_step", "prediction_step",
                   "evaluate")


class HFAdapter:
    """The HF ``Trainer`` override points of one :class:`taskfit.Fit` (owned by it; see the module text): which of
    them the Fit's class overrides, the optimizer slots while ``create_optimizer`` runs, the context a loader
    override runs in, and the defaults the Fit's public methods delegate to.

    Args:
        fit (Fit): the owner; overrides are called through it.
        base (type): the class whose methods are the defaults (``Fit``): a method of ``type(fit)`` that is not
            ``base``'s is an override.
    """

    def __init__(self, fit: Any, base: type) -> None:
        self.fit, self.base = fit, base
        self.creating: list[Any] | None = None  # the optimizer/scheduler slots while create_optimizer runs
        self.loader_run: Any = None  # the run whose loaders an HF get_*_dataloader override builds

    def overrides(self, *names: str) -> bool:
        """True when the Fit's class overrides any of the override points ``names``."""
        cls = type(self.fit)
        return any(getattr(cls, n) is not getattr(self.base, n) for n in names)

    # ------------------------------------------------------------------------------------ optimizer slots ---
    def optimizer(self) -> Any:
        """``Fit.optimizer``: while a ``train()`` builds its optimizer, the one being built; after, the last
        ``fit``'s; before any, ``optimizers[0]`` given to the constructor."""
        fit = self.fit
        if self.creating is not None:
            return self.creating[0]
        if fit._last_fit is not None:
            return fit._last_fit.optimizer
        return fit._optimizers[0]

    def set_optimizer(self, value: Any) -> None:
        """Set the optimizer being built, or (outside ``create_optimizer``) the one the next ``train()`` uses."""
        if self.creating is not None:
            self.creating[0] = value
        else:
            self.fit._optimizers = (value, self.fit._optimizers[1])

    def lr_scheduler(self) -> Any:
        """``Fit.lr_scheduler``, with the timing rules of :meth:`optimizer`."""
        fit = self.fit
        if self.creating is not None:
            return self.creating[1]
        if fit._last_fit is not None:
            return fit._last_fit.lr_scheduler
        return fit._optimizers[1]

    def set_lr_scheduler(self, value: Any) -> None:
        """Set the scheduler being built, or the one the next ``train()`` uses."""
        if self.creating is not None:
            self.creating[1] = value
        else:
            self.fit._optimizers = (self.fit._optimizers[0], value)

    def run_optimizers(self, run: Any, max_steps: int) -> tuple[Any, Any] | None:
        """``(optimizer, scheduler)`` for a new run of a plain model whose class overrides ``create_optimizer`` or
        ``create_scheduler`` (HF order: ``create_optimizer()``, then ``create_scheduler(num_training_steps=
        max_steps)``); None otherwise (the arguments' optimizer is built as without overrides).

        When the strategy builds its own optimizer (a DeepSpeed config with an ``optimizer`` section), the two are
        called with ``fit.optimizer`` / ``fit.lr_scheduler`` holding placeholders, as HF holds accelerate's
        ``DummyOptim`` / ``DummyScheduler`` there: the defaults return them and DeepSpeed builds both.

        Raises:
            ValueError: under such a config, an override that set an optimizer or a scheduler of its own (HF's
                accelerate refuses that combination too).
        """
        fit = self.fit
        if not (isinstance(run.module, ModelTaskModule) and self.overrides("create_optimizer", "create_scheduler")):
            return None
        engine_builds = fit.strategy.builds_own_optimizer
        self.creating = [_PLACEHOLDER_OPTIMIZER, _PLACEHOLDER_SCHEDULER] if engine_builds else list(fit._optimizers)
        try:
            fit.create_optimizer()
            fit.create_scheduler(num_training_steps=max_steps)
            made = tuple(self.creating)
        finally:
            self.creating = None
        if not engine_builds:
            return made
        own = [what for what, got, placeholder in (("an optimizer", made[0], _PLACEHOLDER_OPTIMIZER),
                                                   ("a scheduler", made[1], _PLACEHOLDER_SCHEDULER))
               if got is not placeholder]
        if own:
            raise ValueError(f"The DeepSpeed config has an 'optimizer' section, so DeepSpeed builds the optimizer "
                             f"and its schedule, but {type(fit).__name__}'s create_optimizer/create_scheduler set "
                             f"{' and '.join(own)} of its own. Drop the config's 'optimizer' section, or leave "
                             "self.optimizer / self.lr_scheduler as they are (HF's accelerate refuses this too).")
        return None, None

    def create_optimizer(self, model: nn.Module | None) -> torch.optim.Optimizer:
        """The default of ``Fit.create_optimizer`` (HF ``Trainer.create_optimizer``)."""
        fit = self.fit
        if fit.optimizer is None:
            from taskfit.optim.optimizers import _split_params, create_optimizer

            model = model if model is not None else fit.model
            if fit.optimizer_cls_and_kwargs is not None:
                cls, kwargs = fit.optimizer_cls_and_kwargs
                fit.optimizer = cls(_split_params(model, float(fit.args.weight_decay)), **dict(kwargs))
            else:
                fit.optimizer = create_optimizer(model, fit.args)
        return fit.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None) -> Any:
        """The default of ``Fit.create_scheduler`` (HF ``Trainer.create_scheduler``)."""
        fit = self.fit
        if fit.lr_scheduler is None:
            from taskfit.optim.schedulers import create_scheduler

            fit.lr_scheduler = create_scheduler(optimizer if optimizer is not None else fit.optimizer, fit.args,
                                                num_training_steps)
        return fit.lr_scheduler

    # ------------------------------------------------------------------------------------------- loaders ---
    @contextlib.contextmanager
    def loader_context(self, run: Any, **data: Any) -> Iterator[None]:
        """While an HF loader override runs: the new run builds the loaders, and data given to ``fit`` is what
        ``fit.train_dataset``/``fit.data_collator`` hold (HF's override reads them)."""
        fit = self.fit
        given = {k: v for k, v in data.items() if v is not None}
        saved = {k: getattr(fit, k) for k in given}
        prev, self.loader_run = self.loader_run, run
        for k, v in given.items():
            setattr(fit, k, v)
        try:
            yield
        finally:
            self.loader_run = prev
            for k, v in saved.items():
                setattr(fit, k, v)

    def train_dataloader(self, run: Any, data: Any, collator: Any) -> Any:
        """The run's training loader: through ``fit.get_train_dataloader`` when a subclass overrides it (a plain
        model's run), else built from ``data``."""
        fit = self.fit
        if isinstance(run.module, ModelTaskModule) and self.overrides("get_train_dataloader"):
            with self.loader_context(run, train_dataset=data, data_collator=collator):
                return fit.get_train_dataloader()
        return fit._launcher.loader(data, train=True, collator=collator, what="train dataset", run=run)

    def get_train_dataloader(self) -> Any:
        """The default of ``Fit.get_train_dataloader``.

        Raises:
            ValueError: no ``train_dataset``.
        """
        fit = self.fit
        if fit.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        return fit._launcher.loader(fit.train_dataset, train=True, collator=None, what="train dataset",
                                    run=self.loader_run)

    def get_eval_dataloader(self, eval_dataset: Any) -> Any:
        """The default of ``Fit.get_eval_dataloader``.

        Raises:
            ValueError: neither ``eval_dataset`` nor ``fit.eval_dataset``.
        """
        fit = self.fit
        if eval_dataset is None and fit.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = fit.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = fit.eval_dataset
        return fit._launcher.loader(eval_dataset, train=False, collator=None, what="eval dataset",
                                    run=self.loader_run)

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """The default of ``Fit.get_test_dataloader``."""
        return self.fit._launcher.loader(test_dataset, train=False, collator=None, what="predict dataset",
                                         run=self.loader_run)

    # --------------------------------------------------------------------------------------------- steps ---
    def prepare_inputs(self, inputs: Any) -> Any:
        """``inputs`` on this process's device (HF's private ``Trainer._prepare_inputs``).

        Raises:
            ValueError: an empty batch (as HF).
        """
        if isinstance(inputs, Mapping) and len(inputs) == 0:
            raise ValueError("The batch received was empty, your model won't be able to train on it.")
        return self.fit.strategy.batch_to_device(inputs)

    def hf_model(self, run: Any) -> Any:
        """What an override point gets as ``model``: the user's model, or a :class:`RoutedModel` through the
        strategy's wrapper."""
        forward = self.fit.strategy.step_function(run.module, "model_outputs")
        if forward == run.module.model_outputs:  # not wrapped: the model itself
            return run.model
        return RoutedModel(run.model, forward)

    def hf_training_step(self, run: Any) -> Any:
        """A :class:`HFTrainingStep` calling ``fit.training_step`` when a subclass overrides it (a plain model's
        run); None otherwise (the module's ``training_step`` runs)."""
        if not (isinstance(run.module, ModelTaskModule) and self.overrides("training_step")):
            return None
        return HFTrainingStep(self.fit, run)

    def training_step(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        """The default of ``Fit.training_step`` (HF ``Trainer.training_step``; see there)."""
        fit = self.fit
        model.train()
        loss = fit.compute_loss(model, inputs, num_items_in_batch=None)
        run = fit._run
        weight = getattr(run, "loss_weight", None) if run is not None else None
        if weight is not None:
            loss = loss * weight
        fused = fused_backward_of(run.optimizer, fit.strategy) if run is not None else None
        (fused or fit.strategy.backward)(loss)  # LOMO / AdaLomo: the update runs inside backward (HF)
        return loss.detach()

    def hf_prediction_step(self, run: Any, stage: str, ignore_keys: list[str] | None) -> Any:
        """``batch -> {"loss", "logits", "labels"}`` calling ``fit.prediction_step`` when a subclass overrides it
        (a plain model's run); None otherwise."""
        fit = self.fit
        if not (isinstance(run.module, ModelTaskModule) and self.overrides("prediction_step")):
            return None
        model = self.hf_model(run)
        # HF: evaluate() asks for the loss only without compute_metrics; predict() follows the argument
        loss_only = fit.args.prediction_loss_only or (stage != "predict" and fit.compute_metrics is None)

        def step(batch: Any) -> dict[str, Any]:
            loss, logits, labels = fit.prediction_step(model, batch, loss_only, ignore_keys=ignore_keys)
            return {"loss": loss, "logits": logits, "labels": labels}
        return step

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None) -> tuple[Any, Any, Any]:
        """The default of ``Fit.prediction_step`` (HF ``Trainer.prediction_step``; see there)."""
        from taskfit.core.wrapping import inference_ignore_keys, prediction_logits, run_model

        fit = self.fit
        label_names = fit.args.label_names or getattr(fit.module, "label_names", None) or ["labels"]
        has_labels = isinstance(inputs, Mapping) and all(inputs.get(k) is not None for k in label_names)
        ignore_keys = inference_ignore_keys(fit.model, ignore_keys)
        labels = None
        if has_labels:
            found = tuple(inputs[k].detach() if isinstance(inputs[k], torch.Tensor) else inputs[k]
                          for k in label_names)
            labels = found[0] if len(found) == 1 else found
        with torch.no_grad():
            if has_labels:
                loss, outputs = fit.compute_loss(model, inputs, return_outputs=True)
                loss = loss.detach().mean()
                logits = (prediction_logits(outputs, True, ignore_keys) if isinstance(outputs, Mapping)
                          else tuple(outputs[1:]))
            else:
                loss = None
                outputs = run_model(model, inputs)
                logits = (prediction_logits(outputs, False, ignore_keys) if isinstance(outputs, Mapping)
                          else tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,))
        if prediction_loss_only:
            return loss, None, None
        if isinstance(logits, tuple):
            logits = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in logits)
            return loss, (logits[0] if len(logits) == 1 else logits), labels
        return loss, (logits.detach() if isinstance(logits, torch.Tensor) else logits), labels


class HFTrainingStep:
    """The fit loop's call of an overridden HF ``training_step`` for one run.

    ``items(window)`` is once per accumulation window what HF's ``get_batch_samples`` passes as
    ``num_items_in_batch``: when the batches are dicts with ``"labels"`` and the model's ``forward`` takes
    ``**kwargs`` (or the model sets ``accepts_loss_kwargs``) or ``compute_loss_func`` is given, the count of labels
    that are not -100 over the window (``labels[..., 1:]`` for causal LMs, ``shift_labels`` when the batch has
    them) as a float32 0-dim tensor on the run's device, summed over the processes with
    ``average_tokens_across_devices`` and divided by the tensor-parallel size, as HF 5; else None.
    ``step(batch, weight, num_items)`` runs the override on one micro-batch (``weight``: its share of the window,
    read by the default ``training_step``) and returns its detached scalar loss.

    Raises:
        TypeError: the override returned something other than a scalar tensor.
    """

    def __init__(self, fit: Any, run: Any) -> None:
        self.fit, self.run = fit, run
        self.model = fit._hf.hf_model(run)
        user_model = run.model
        accepts = getattr(user_model, "accepts_loss_kwargs", None)
        if accepts is None:
            params = inspect.signature(user_model.forward).parameters.values()
            accepts = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
        self.counts = bool(accepts) or fit.compute_loss_func is not None  # decided once per run, as HF

    def items(self, window: list[Any]) -> Any:
        """HF's ``num_items_in_batch`` for the micro-batches of one accumulation window (see the class text)."""
        if not (self.counts and window and isinstance(window[0], Mapping) and "labels" in window[0]):
            return None
        shifted = getattr(self.run.module, "_shifted", False)
        try:
            n = sum((b["shift_labels"] if "shift_labels" in b else b["labels"][..., 1:] if shifted
                     else b["labels"]).ne(-100).sum() for b in window)
        except (TypeError, AttributeError):  # labels that are no tensors: HF passes None
            return None
        strategy, args = self.fit.strategy, self.fit.args
        n = torch.as_tensor(n).to(strategy.root_device)
        world = strategy.world_size
        if args.average_tokens_across_devices and world > 1:
            n = strategy.reduce(n, "sum")
        return n / (world // strategy.data_parallel_size)  # HF: / tp size, a float tensor

    def __call__(self, batch: Any, weight: Any, num_items: Any) -> torch.Tensor:
        self.run.loss_weight = weight
        loss = self.fit.training_step(self.model, batch, num_items)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"training_step must return the (detached) scalar loss tensor, as HF's does; it "
                            f"returned {type(loss).__name__}"
                            f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {tuple(loss.shape)}'}.")
        return loss.detach().reshape(())
