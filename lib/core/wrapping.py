"""Training a plain ``nn.Module`` (e.g. a Hugging Face model) without writing a TaskModule (F-CORE-2).

The model's forward must return the loss when given labels (first tuple element, ``.loss`` attribute or
``"loss"`` key), as HF models do. ``Fit.compute_loss`` is the override point, as ``Trainer.compute_loss`` is.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from taskfit.core.module import IGNORE_INDEX, TaskModule, infer_batch_size


def run_model(model: nn.Module, inputs: Any) -> Any:
    """Call ``model`` HF-style: ``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple/list."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return model(*inputs)
    return model(inputs)


def extract_loss(outputs: Any) -> torch.Tensor | None:
    """The loss in a model's outputs: ``outputs["loss"]``, ``outputs.loss``, ``outputs[0]`` or the tensor itself."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    if hasattr(outputs, "loss"):
        return outputs.loss
    if isinstance(outputs, (list, tuple)):
        return outputs[0] if outputs else None
    return outputs if isinstance(outputs, torch.Tensor) else None


def extract_logits(outputs: Any, has_loss: bool) -> Any:
    """The predictions in a model's outputs: ``.logits``/``"logits"``, else every non-loss element."""
    if isinstance(outputs, Mapping) or hasattr(outputs, "logits"):
        logits = outputs.get("logits") if isinstance(outputs, Mapping) else outputs.logits
        if logits is not None:
            return logits
        if isinstance(outputs, Mapping):
            rest = tuple(v for k, v in outputs.items() if k != "loss" and isinstance(v, torch.Tensor))
            return rest[0] if len(rest) == 1 else rest
    if isinstance(outputs, (list, tuple)):
        rest = outputs[1:] if has_loss else outputs
        return rest[0] if len(rest) == 1 else tuple(rest)
    return outputs


def inference_ignore_keys(model: nn.Module, ignore_keys: list[str] | None) -> list[str]:
    """``ignore_keys``, else HF's default: ``model.config.keys_to_ignore_at_inference`` (``["past_key_values"]``
    when the config has none), or ``[]`` for a model without a ``config`` (HF ``Trainer.prediction_step``)."""
    if ignore_keys is not None:
        return list(ignore_keys)
    config = getattr(model, "config", None)
    return list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"])) if config is not None else []


def prediction_logits(outputs: Any, has_loss: bool, ignore_keys: list[str]) -> Any:
    """The predictions of one evaluation batch as HF ``Trainer.prediction_step`` takes them: from dict outputs
    (a ``ModelOutput`` included) every value whose key is not in ``ignore_keys`` (nor ``"loss"`` when
    ``has_loss``), in the outputs' order, one value unwrapped and several a tuple (``(logits, hidden_states)``
    for a model asked for its hidden states); keys holding None are left out (a ``ModelOutput`` has none). Other
    outputs as :func:`extract_logits`."""
    if not isinstance(outputs, Mapping):
        return extract_logits(outputs, has_loss)
    skip = set(ignore_keys) | ({"loss"} if has_loss else set())
    rest = tuple(v for k, v in outputs.items() if k not in skip and v is not None)
    return None if not rest else rest[0] if len(rest) == 1 else rest


def model_loss(fit: Any, model: nn.Module, inputs: Any, return_outputs: bool = False,
               num_items_in_batch: Any = None) -> Any:
    """The body of ``Fit.compute_loss`` (HF ``Trainer.compute_loss``): the model's own loss, or
    ``fit.compute_loss_func(outputs, labels, num_items_in_batch=...)`` with the labels taken out of the batch.

    Raises:
        ValueError: the model returned no loss or a non-scalar one (no labels in the batch?).
    """
    label_names = fit.args.label_names or getattr(fit.module, "label_names", ["labels"])
    if fit.compute_loss_func is not None and isinstance(inputs, Mapping):
        labels = inputs[label_names[0]]
        outputs = model(**{k: v for k, v in inputs.items() if k not in label_names})
        loss = fit.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
    else:
        outputs = run_model(model, inputs)
        loss = extract_loss(outputs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        keys = sorted(inputs) if isinstance(inputs, Mapping) else type(inputs).__name__
        got = "no loss" if loss is None else (f"a tensor of shape {tuple(loss.shape)}, not a scalar loss"
                                              if isinstance(loss, torch.Tensor) else type(loss).__name__)
        raise ValueError(f"{type(model).__name__} returned {got} for a batch with {keys}; a plain model must "
                         f"return the loss when given the labels ({label_names}). Override Fit.compute_loss, "
                         "pass compute_loss_func, or write a TaskModule.")
    return (loss, outputs) if return_outputs else loss


def _has_tensor(batch: Any) -> bool:
    if isinstance(batch, torch.Tensor):
        return True
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return any(_has_tensor(v) for v in values)


def is_causal_lm(model: nn.Module) -> bool:
    """HF's rule for models that shift labels inside forward (``*ForCausalLM``, ``*LMHeadModel``)."""
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


class LabelSmoother:
    """``label_smoothing_factor`` for plain models, used as ``compute_loss_func`` (mirrors HF ``LabelSmoother``).

    Loss = ``(1 - epsilon) * NLL + epsilon * mean over classes of -log p``, averaged over labels that are not
    ``-100`` (or divided by ``num_items_in_batch`` when given); the value of ``F.cross_entropy(logits, labels,
    ignore_index=-100, label_smoothing=epsilon)``, computed with HF's operations (the same bits in fp32). Causal LMs (:func:`is_causal_lm`) predict the next token: logits ``[..., :-1, :]``
    against labels ``[..., 1:]``.

    Args:
        epsilon (float): smoothing factor in [0, 1).
        fit (Fit | None): the run (its ``model`` decides the causal-LM shift).

    Call: ``smoother(outputs, labels, num_items_in_batch=None)`` with the model's outputs (logits of shape
    ``(..., num_classes)``) and integer labels of shape ``(...)``; returns a 0-dim tensor.

    Raises:
        ValueError: ``epsilon`` outside [0, 1); outputs without logits.
    """

    def __init__(self, epsilon: float, fit: Any = None) -> None:
        if not 0 <= epsilon < 1:
            raise ValueError(f"label_smoothing_factor must be in [0, 1), got {epsilon!r}.")
        self.epsilon, self.fit = float(epsilon), fit

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        logits = extract_logits(outputs, has_loss=False)
        if not isinstance(logits, torch.Tensor):
            raise ValueError(f"label_smoothing_factor needs the model to return logits, got {type(outputs).__name__}.")
        model = getattr(self.fit, "model", None)
        if model is not None and is_causal_lm(model):
            logits, labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
        # HF's LabelSmoother, operation for operation (F.cross_entropy's label_smoothing is the same value but
        # rounds differently): the same bits as transformers in fp32
        log_probs = -F.log_softmax(logits, dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding = labels.eq(IGNORE_INDEX)
        nll = log_probs.gather(dim=-1, index=torch.clamp(labels, min=0))
        smoothed = log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32)
        nll.masked_fill_(padding, 0.0)
        smoothed.masked_fill_(padding, 0.0)
        count = (padding.numel() - padding.long().sum() if num_items_in_batch is None
                 else num_items_in_batch.to(nll.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
        return (1 - self.epsilon) * (nll.sum() / count) + self.epsilon * (smoothed.sum() / (count * log_probs.shape[-1]))


def apply_use_cache(model: nn.Module, use_cache: bool) -> None:
    """Set ``model.config.use_cache = use_cache`` when the model has a ``config`` (mirrors HF ``Trainer.__init__``,
    which sets it from ``TrainingArguments.use_cache``, default False, for the whole life of the trainer).

    Why it matters: an HF model with its cache on builds a cache while training and then ignores the sequence
    boundaries that ``position_ids`` mark in a packed row (``DataCollatorWithFlattening``), so the loss differs.

    Args:
        model (nn.Module): the user's model (a PEFT model forwards ``config`` to its base model).
        use_cache (bool): the value to set.
    """
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = use_cache


def default_label_names(model: nn.Module) -> list[str]:
    """HF's rule: ``["start_positions", "end_positions"]`` for question answering models, else ``["labels"]``."""
    return ["start_positions", "end_positions"] if "QuestionAnswering" in type(model).__name__ else ["labels"]


class ModelTaskModule(TaskModule):
    """Adapter that trains ``model`` through its own loss (built by ``Fit`` for non-TaskModule models).

    Args:
        model (nn.Module): forward returns the loss when labels are in the batch.
        label_names (list[str] | None): batch keys holding labels (``FitArguments.label_names``).

    The wrapped model is ``self.model``; checkpoints and ``save_model`` store its own state dict keys.
    """

    def __init__(self, model: nn.Module, label_names: list[str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.label_names = list(label_names) if label_names else default_label_names(model)
        # causal LMs shift labels inside forward: the loss averages over labels[..., 1:]
        self._shifted = is_causal_lm(model)
        self._checked = False
        #: output keys left out of the predictions (HF ``ignore_keys``), set by the evaluation loop for its pass;
        #: None = the model config's ``keys_to_ignore_at_inference``
        self.ignore_keys: list[str] | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def setup(self, stage: str) -> None:
        """Apply ``FitArguments.use_cache`` to the model's config at the start of every stage (see
        :func:`apply_use_cache`)."""
        apply_use_cache(self.model, self.fit.args.use_cache)

    def model_outputs(self, inputs: Any) -> Any:
        """``model(**inputs)`` (``model(*inputs)`` for a tuple): what an HF override point's ``model(...)`` call
        runs, routed through the strategy's wrapper as a step method."""
        return run_model(self.model, inputs)

    def _check_batch(self, batch: Any) -> None:
        """First-batch check that the model can be called HF-style with this batch (clear errors up front)."""
        self._checked = True
        if not _has_tensor(batch):
            sample = type(batch[0]).__name__ if isinstance(batch, (list, tuple)) and batch else type(batch).__name__
            raise TypeError(f"{type(self.model).__name__} received a batch without tensors (items of type {sample}); "
                            "pass a data_collator (or a tokenizer as processing_class) that turns samples into "
                            "tensors.")
        sig = inspect.signature(self.model.forward)
        how = "model(**batch)" if isinstance(batch, Mapping) else "model(*batch)"
        try:
            sig.bind(**batch) if isinstance(batch, Mapping) else sig.bind(*batch) if isinstance(
                batch, (list, tuple)) else sig.bind(batch)
        except TypeError as exc:
            keys = sorted(batch) if isinstance(batch, Mapping) else f"{len(batch)} elements"
            raise TypeError(f"{type(self.model).__name__}.forward{sig} cannot be called as {how} with this batch "
                            f"({keys}): {exc}. A plain model must take the batch's inputs and labels and return "
                            "the loss; otherwise write a TaskModule or pass compute_loss_func.") from None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """The model's own loss through ``Fit.compute_loss`` (checked against the batch on the first call)."""
        if not self._checked:
            self._check_batch(batch)
            if isinstance(self.fit.compute_loss_func, LabelSmoother) and not isinstance(batch, Mapping):
                raise ValueError("label_smoothing_factor needs dict batches with the labels under "
                                 f"{self.label_names}; got {type(batch).__name__} batches.")
        return self.fit.compute_loss(self.model, batch)

    def _labels(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)) and len(batch) > 1:
            return batch[-1]
        if isinstance(batch, Mapping):
            found = [batch[k] for k in self.label_names if k in batch]
            return (found[0] if len(found) == 1 else tuple(found)) if found else None
        return None

    def _loss_and_logits(self, batch: Any) -> tuple[torch.Tensor | None, Any]:
        """Loss through ``Fit.compute_loss`` when the batch has labels (so overrides and ``compute_loss_func``
        shape ``eval_loss`` too, as in HF ``prediction_step``), and the predictions (:func:`prediction_logits`
        with :attr:`ignore_keys`)."""
        if not self._checked:
            self._check_batch(batch)
        ignore = inference_ignore_keys(self.model, self.ignore_keys)
        if self._labels(batch) is None:
            return None, prediction_logits(run_model(self.model, batch), False, ignore)
        loss, outputs = self.fit.compute_loss(self.model, batch, return_outputs=True)
        if isinstance(outputs, Mapping):  # HF: every output but the loss and ignore_keys
            return loss, prediction_logits(outputs, True, ignore)
        return loss, extract_logits(outputs, has_loss=self.fit.compute_loss_func is None)

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """``{"loss", "logits", "labels"}`` for one batch (loss None without labels), as HF ``prediction_step``."""
        loss, logits = self._loss_and_logits(batch)
        return {"loss": loss, "logits": logits, "labels": self._labels(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return self.validation_step(batch, batch_idx)

    def num_items(self, batch: Any) -> int | None:
        labels = self._labels(batch)
        if isinstance(labels, torch.Tensor) and labels.dim() >= 2:
            if self._shifted:
                labels = labels[..., 1:]
            return (labels != IGNORE_INDEX).sum()
        return infer_batch_size(batch)

    def num_parameters(self, only_trainable: bool = False) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad or not only_trainable)
