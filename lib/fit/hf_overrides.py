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


def hf_overrides(fit: Any, *names: str) -> bool:
    """True when ``type(fit)`` overrides any of the HF override points ``names`` of :class:`HFOverridePoints`."""
    cls = type(fit)
    return any(getattr(cls, n) is not getattr(HFOverridePoints, n) for n in names)


class _EnginePlaceholder:
    """What :attr:`HFOverridePoints.optimizer` / ``lr_scheduler`` hold while the override points run for a strategy
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


class HFOverridePoints:
    """Mixin of :class:`taskfit.Fit` with HF ``Trainer``'s subclass override points (see the module text)."""

    args: Any
    strategy: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Any
    optimizer_cls_and_kwargs: Any
    _optimizers: tuple[Any, Any]
    _run: Any
    _last_fit: Any

    # ------------------------------------------------------------------------------------ optimizer slots ---
    @property
    def optimizer(self) -> Any:
        """The optimizer (HF ``Trainer.optimizer``): while a ``train()`` builds its optimizer, the one being built
        (None until ``create_optimizer`` sets it); after, the last ``fit``'s; before any, ``optimizers[0]`` given
        to the constructor. Settable, as in HF: inside ``create_optimizer`` it is the run's optimizer, outside it
        the optimizer the next ``train()`` starts from."""
        slots = getattr(self, "_creating", None)
        if slots is not None:
            return slots[0]
        if self._last_fit is not None:
            return self._last_fit.optimizer
        return self._optimizers[0]

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        slots = getattr(self, "_creating", None)
        if slots is not None:
            slots[0] = value
        else:
            self._optimizers = (value, self._optimizers[1])

    @property
    def lr_scheduler(self) -> Any:
        """The LR scheduler (HF ``Trainer.lr_scheduler``), with the same timing rules as :attr:`optimizer`."""
        slots = getattr(self, "_creating", None)
        if slots is not None:
            return slots[1]
        if self._last_fit is not None:
            return self._last_fit.lr_scheduler
        return self._optimizers[1]

    @lr_scheduler.setter
    def lr_scheduler(self, value: Any) -> None:
        slots = getattr(self, "_creating", None)
        if slots is not None:
            slots[1] = value
        else:
            self._optimizers = (self._optimizers[0], value)

    def _run_optimizers(self, run: Any, max_steps: int) -> tuple[Any, Any] | None:
        """``(optimizer, scheduler)`` for a new run of a plain model whose class overrides ``create_optimizer`` or
        ``create_scheduler`` (HF order: ``create_optimizer()``, then ``create_scheduler(num_training_steps=
        max_steps)``); None otherwise (the arguments' optimizer is built as without overrides).

        When the strategy builds its own optimizer (a DeepSpeed config with an ``optimizer`` section), the two are
        called with :attr:`optimizer` / :attr:`lr_scheduler` holding placeholders, as HF holds accelerate's
        ``DummyOptim`` / ``DummyScheduler`` there: the defaults return them and DeepSpeed builds both.

        Raises:
            ValueError: under such a config, an override that set an optimizer or a scheduler of its own (HF's
                accelerate refuses that combination too).
        """
        if not (isinstance(run.module, ModelTaskModule) and hf_overrides(self, "create_optimizer", "create_scheduler")):
            return None
        engine_builds = bool(getattr(self.strategy, "builds_own_optimizer", False))
        self._creating = [_PLACEHOLDER_OPTIMIZER, _PLACEHOLDER_SCHEDULER] if engine_builds else list(self._optimizers)
        try:
            self.create_optimizer()
            self.create_scheduler(num_training_steps=max_steps)
            made = tuple(self._creating)
        finally:
            self._creating = None
        if not engine_builds:
            return made
        own = [what for what, got, placeholder in (("an optimizer", made[0], _PLACEHOLDER_OPTIMIZER),
                                                   ("a scheduler", made[1], _PLACEHOLDER_SCHEDULER))
               if got is not placeholder]
        if own:
            raise ValueError(f"The DeepSpeed config has an 'optimizer' section, so DeepSpeed builds the optimizer "
                             f"and its schedule, but {type(self).__name__}'s create_optimizer/create_scheduler set "
                             f"{' and '.join(own)} of its own. Drop the config's 'optimizer' section, or leave "
                             "self.optimizer / self.lr_scheduler as they are (HF's accelerate refuses this too).")
        return None, None

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Build the optimizer and the LR schedule (HF ``Trainer.create_optimizer_and_scheduler``): calls
        :meth:`create_optimizer` then :meth:`create_scheduler`. Not called by ``train()`` (HF 5 neither)."""
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Set :attr:`optimizer` unless one is set already (the constructor's ``optimizers[0]``), and return it
        (HF ``Trainer.create_optimizer``): ``optimizer_cls_and_kwargs`` over HF's decay / no-decay parameter
        groups, else the optimizer ``args.optim`` names. Override it in a subclass to build your own."""
        if self.optimizer is None:
            from taskfit.optim.optimizers import _split_params, create_optimizer

            model = model if model is not None else self.model
            if self.optimizer_cls_and_kwargs is not None:
                cls, kwargs = self.optimizer_cls_and_kwargs
                self.optimizer = cls(_split_params(model, float(self.args.weight_decay)), **dict(kwargs))
            else:
                self.optimizer = create_optimizer(model, self.args)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Set :attr:`lr_scheduler` unless one is set already, and return it (HF ``Trainer.create_scheduler``): the
        schedule ``args.lr_scheduler_type`` names over ``num_training_steps`` optimizer steps, for ``optimizer``
        (default :attr:`optimizer`)."""
        if self.lr_scheduler is None:
            from taskfit.optim.schedulers import create_scheduler

            self.lr_scheduler = create_scheduler(optimizer if optimizer is not None else self.optimizer, self.args,
                                                 num_training_steps)
        return self.lr_scheduler

    # ------------------------------------------------------------------------------------------- loaders ---
    @contextlib.contextmanager
    def _loader_context(self, run: Any, **data: Any) -> Iterator[None]:
        """While an HF loader override runs: the new run builds the loaders, and data given to ``fit`` is what
        ``self.train_dataset``/``self.data_collator`` hold (HF's override reads them)."""
        given = {k: v for k, v in data.items() if v is not None}
        saved = {k: getattr(self, k) for k in given}
        prev, self._loader_run = getattr(self, "_loader_run", None), run
        for k, v in given.items():
            setattr(self, k, v)
        try:
            yield
        finally:
            self._loader_run = prev
            for k, v in saved.items():
                setattr(self, k, v)

    def _train_dataloader(self, run: Any, data: Any, collator: Any) -> Any:
        """The run's training loader: through :meth:`get_train_dataloader` when a subclass overrides it (a plain
        model's run), else built from ``data``."""
        if isinstance(run.module, ModelTaskModule) and hf_overrides(self, "get_train_dataloader"):
            with self._loader_context(run, train_dataset=data, data_collator=collator):
                return self.get_train_dataloader()
        return self._loader(data, train=True, collator=collator, what="train dataset", run=run)

    def get_train_dataloader(self) -> Any:
        """The training loader over ``self.train_dataset`` (HF ``Trainer.get_train_dataloader``): per-process batch
        size, shuffled (distributed sampler under several processes), ``data_collator``, unused columns removed.

        Raises:
            ValueError: no ``train_dataset``.
        """
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        return self._loader(self.train_dataset, train=True, collator=None, what="train dataset",
                            run=getattr(self, "_loader_run", None))

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The evaluation loader (HF ``Trainer.get_eval_dataloader``): over ``eval_dataset``, a key of a dict
        ``self.eval_dataset`` (a ``str``), or ``self.eval_dataset``.

        Raises:
            ValueError: neither ``eval_dataset`` nor ``self.eval_dataset``.
        """
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        return self._loader(eval_dataset, train=False, collator=None, what="eval dataset",
                            run=getattr(self, "_loader_run", None))

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """The prediction loader over ``test_dataset`` (HF ``Trainer.get_test_dataloader``)."""
        return self._loader(test_dataset, train=False, collator=None, what="predict dataset",
                            run=getattr(self, "_loader_run", None))

    # --------------------------------------------------------------------------------------------- steps ---
    def _prepare_inputs(self, inputs: Any) -> Any:
        """``inputs`` on this process's device (HF's private ``Trainer._prepare_inputs``, which step overrides
        often call; the loops have moved the batch already, so this is then a no-op).

        Raises:
            ValueError: an empty batch (as HF).
        """
        if isinstance(inputs, Mapping) and len(inputs) == 0:
            raise ValueError("The batch received was empty, your model won't be able to train on it.")
        return self.strategy.batch_to_device(inputs)

    def _hf_model(self, run: Any) -> Any:
        """What an override point gets as ``model``: the user's model, or a :class:`RoutedModel` through the
        strategy's wrapper."""
        forward = self.strategy.step_function(run.module, "model_outputs")
        if forward == run.module.model_outputs:  # not wrapped: the model itself
            return run.model
        return RoutedModel(run.model, forward)

    def _hf_training_step(self, run: Any) -> Any:
        """A :class:`HFTrainingStep` calling :meth:`training_step` when a subclass overrides it (a plain model's
        run); None otherwise (the module's ``training_step`` runs)."""
        if not (isinstance(run.module, ModelTaskModule) and hf_overrides(self, "training_step")):
            return None
        return HFTrainingStep(self, run)

    def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """One micro-batch of a plain model (HF ``Trainer.training_step``): ``model.train()``, the loss from
        :meth:`compute_loss`, weighted by the micro-batch's share of the accumulation window (HF: divided by
        ``gradient_accumulation_steps``), backward through the strategy; returns the weighted loss, detached.
        Override it in a subclass (e.g. to add a penalty or scale the loss); call ``loss.backward()`` or
        ``super().training_step``. ``num_items_in_batch`` is what HF passes (see :class:`HFTrainingStep`), for an
        override's own use; this default step leaves it out of :meth:`compute_loss` (which gets None), since the
        window weight already normalises the loss (HF instead skips its division by the accumulation steps when
        the model or ``compute_loss_func`` takes the count: the same gradients, a documented difference)."""
        model.train()
        loss = self.compute_loss(model, inputs, num_items_in_batch=None)
        run = self._run
        weight = getattr(run, "loss_weight", None) if run is not None else None
        if weight is not None:
            loss = loss * weight
        fused = fused_backward_of(run.optimizer, self.strategy) if run is not None else None
        (fused or self.strategy.backward)(loss)  # LOMO / AdaLomo: the update runs inside backward (HF)
        return loss.detach()

    def _hf_prediction_step(self, run: Any, stage: str, ignore_keys: list[str] | None) -> Any:
        """``batch -> {"loss", "logits", "labels"}`` calling :meth:`prediction_step` when a subclass overrides it
        (a plain model's run); None otherwise."""
        if not (isinstance(run.module, ModelTaskModule) and hf_overrides(self, "prediction_step")):
            return None
        model = self._hf_model(run)
        # HF: evaluate() asks for the loss only without compute_metrics; predict() follows the argument
        loss_only = self.args.prediction_loss_only or (stage != "predict" and self.compute_metrics is None)

        def step(batch: Any) -> dict[str, Any]:
            loss, logits, labels = self.prediction_step(model, batch, loss_only, ignore_keys=ignore_keys)
            return {"loss": loss, "logits": logits, "labels": labels}
        return step

    def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """``(loss, logits, labels)`` of one evaluation batch (HF ``Trainer.prediction_step``): the loss from
        :meth:`compute_loss` when the batch has every label (None otherwise), the outputs other than the loss and
        ``ignore_keys`` (default the model config's ``keys_to_ignore_at_inference``) as logits (a single one
        unwrapped), the labels; with ``prediction_loss_only`` ``(loss, None, None)``. Runs under ``no_grad``."""
        from taskfit.core.wrapping import inference_ignore_keys, prediction_logits, run_model

        label_names = self.args.label_names or getattr(self.module, "label_names", None) or ["labels"]
        has_labels = isinstance(inputs, Mapping) and all(inputs.get(k) is not None for k in label_names)
        ignore_keys = inference_ignore_keys(self.model, ignore_keys)
        labels = None
        if has_labels:
            found = tuple(inputs[k].detach() if isinstance(inputs[k], torch.Tensor) else inputs[k]
                          for k in label_names)
            labels = found[0] if len(found) == 1 else found
        with torch.no_grad():
            if has_labels:
                loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
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
        self.model = fit._hf_model(run)
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
        return n / (world // getattr(strategy, "data_parallel_size", world))  # HF: / tp size, a float tensor

    def __call__(self, batch: Any, weight: Any, num_items: Any) -> torch.Tensor:
        self.run.loss_weight = weight
        loss = self.fit.training_step(self.model, batch, num_items)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"training_step must return the (detached) scalar loss tensor, as HF's does; it "
                            f"returned {type(loss).__name__}"
                            f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {tuple(loss.shape)}'}.")
        return loss.detach().reshape(())
