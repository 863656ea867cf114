"""The HF ``Trainer`` members of ``Fit`` besides its stages (``train``/``evaluate``/``predict``): the callback list
API, parameter and learning-rate queries, the override points a subclass replaces (loss, optimizer, scheduler,
loaders, training and prediction step, FLOPs), and the outputs (the model, metrics files, the state, a model card,
a push to the Hub). Each is a function of the ``Fit`` it is called on (``self``), bound into ``Fit``'s class body
by name (``Fit.save_model = hf_members.save_model``: no base class), so a subclass of ``Fit`` overrides it as it
would HF's; it forwards to an object that ``Fit`` owns (``_api``: :class:`~taskfit.fit.hf_api.HFTrainerAPI`,
``_hf``: :class:`~taskfit.fit.hf_overrides.HFAdapter`) or to :mod:`taskfit.fit.outputs`. Mirrors HF ``Trainer``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from taskfit.core.wrapping import model_loss
from taskfit.data.loaders import floating_point_ops as estimated_flops
from taskfit.fit import outputs


def hf_parameter_count(model: Any) -> int | None:
    """``model.num_parameters(exclude_embeddings=True)`` of a ``transformers.PreTrainedModel`` (what HF's
    ``floating_point_ops`` multiplies by); None for a model without that method (a TaskModule's own
    ``num_parameters`` takes no such argument)."""
    count = getattr(model, "num_parameters", None)
    if not callable(count):
        return None
    try:
        return int(count(exclude_embeddings=True))
    except TypeError:
        return None


def hf_floating_point_ops(model: Any, inputs: Any, run: Any = None) -> int:
    """Training FLOPs (forward and backward) of one micro-batch ``inputs`` (mirrors HF
    ``Trainer.floating_point_ops``): for a model with ``num_parameters(exclude_embeddings=True)`` (a
    ``PreTrainedModel``) ``6 x elements of its main input (input_ids: tokens) x non-embedding parameters``; for
    any other model, where HF counts 0, taskfit's estimate :func:`taskfit.data.loaders.floating_point_ops`
    (6 x parameters x tokens or samples).

    Args:
        model (nn.Module): the user's model. inputs (dict[str, Tensor] | Any): the micro-batch.
        run (Run | None): the current run, whose ``flos_params`` (counted before sharding) is used when set.

    Returns:
        int: FLOPs.
    """
    main = getattr(model, "main_input_name", "input_ids")
    params = run.flos_params if run is not None and run.flos_params is not None else hf_parameter_count(model)
    if isinstance(inputs, Mapping) and main in inputs and params is not None:
        return 6 * inputs[main].numel() * params
    return estimated_flops(model, inputs)


# ------------------------------------- HF Trainer members (bodies in taskfit.fit.hf_api.HFTrainerAPI) ---
def callback_handler(self) -> Any:
    """HF ``Trainer.callback_handler``: a live view of :attr:`callbacks` (``.callbacks`` is that list)."""
    return self._api.callback_handler()


def add_callback(self, callback: Any) -> None:
    """Add a callback instance or class (HF ``add_callback``; warns as HF for a second one of a class)."""
    self._api.add_callback(callback)


def pop_callback(self, callback: Any) -> Any:
    """Remove and return the first callback equal to ``callback`` or of that class (HF ``pop_callback``)."""
    return self._api.pop_callback(callback)


def remove_callback(self, callback: Any) -> None:
    """Remove the first callback equal to ``callback`` or of that class (HF ``remove_callback``)."""
    self._api.pop_callback(callback)


def model_wrapped(self) -> Any:
    """The model as the strategy wrapped it for the current or last run (HF ``Trainer.model_wrapped``)."""
    return self._api.model_wrapped()


def get_num_trainable_parameters(self) -> int:
    """Parameters with ``requires_grad`` of :attr:`model` (HF ``get_num_trainable_parameters``)."""
    return self._api.get_num_trainable_parameters()


def get_learning_rates(self) -> list[float]:
    """Each parameter group's learning rate (HF ``get_learning_rates``). Raises ValueError: no optimizer."""
    return self._api.get_learning_rates()


def get_optimizer_group(self, param: Any = None) -> Any:
    """The group holding ``param``, or every group's parameters (HF ``get_optimizer_group``)."""
    return self._api.get_optimizer_group(param)


def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
    """Names of ``model``'s parameters that get weight decay (HF ``get_decay_parameter_names``)."""
    return self._api.get_decay_parameter_names(model)


# ---------------------------------------------------------------------------------- loss / output ---
def compute_loss(self, model: nn.Module, inputs: Any, return_outputs: bool = False,
                 num_items_in_batch: int | None = None) -> Any:
    """Loss of a plain model on ``inputs`` (mirrors HF ``Trainer.compute_loss``; override it in a subclass
    for a custom loss, e.g. class weights). With ``compute_loss_func`` the labels are taken out of the
    batch and passed to it with the outputs.

    Raises:
        ValueError: the model returned no loss or a non-scalar one (no labels in the batch?).
    """
    return model_loss(self, model, inputs, return_outputs, num_items_in_batch)


# ------------------------------------------------------------------------------------ data helpers ---
def floating_point_ops(self, inputs: Any) -> int:
    """Training FLOPs of one micro-batch, summed into ``state.total_flos``; an override point (mirrors HF
    ``Trainer.floating_point_ops``; see :func:`hf_floating_point_ops`)."""
    return hf_floating_point_ops(self.model or nn.Module(), inputs, self._run)


# ------------------------------- HF override points (defaults in the adapter; see taskfit.fit.hf_overrides) ---
def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
    """Build the optimizer and the LR schedule (HF ``Trainer.create_optimizer_and_scheduler``): calls
    :meth:`create_optimizer` then :meth:`create_scheduler`. Not called by ``train()`` (HF 5 neither)."""
    self.create_optimizer()
    self.create_scheduler(num_training_steps=num_training_steps)


def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
    """Set :attr:`optimizer` unless one is set already (the constructor's ``optimizers[0]``), and return it
    (HF ``Trainer.create_optimizer``): ``optimizer_cls_and_kwargs`` over HF's decay / no-decay parameter
    groups, else the optimizer ``args.optim`` names. Override it in a subclass to build your own."""
    return self._hf.create_optimizer(model)


def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
    """Set :attr:`lr_scheduler` unless one is set already, and return it (HF ``Trainer.create_scheduler``): the
    schedule ``args.lr_scheduler_type`` names over ``num_training_steps`` optimizer steps, for ``optimizer``
    (default :attr:`optimizer`)."""
    return self._hf.create_scheduler(num_training_steps, optimizer)


def get_train_dataloader(self) -> Any:
    """The training loader over ``self.train_dataset`` (HF ``Trainer.get_train_dataloader``): per-process batch
    size, shuffled (distributed sampler under several processes), ``data_collator``, unused columns removed.

    Raises:
        ValueError: no ``train_dataset``.
    """
    return self._hf.get_train_dataloader()


def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
    """The evaluation loader (HF ``Trainer.get_eval_dataloader``): over ``eval_dataset``, a key of a dict
    ``self.eval_dataset`` (a ``str``), or ``self.eval_dataset``.

    Raises:
        ValueError: neither ``eval_dataset`` nor ``self.eval_dataset``.
    """
    return self._hf.get_eval_dataloader(eval_dataset)


def get_test_dataloader(self, test_dataset: Any) -> Any:
    """The prediction loader over ``test_dataset`` (HF ``Trainer.get_test_dataloader``)."""
    return self._hf.get_test_dataloader(test_dataset)


def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
    """One micro-batch of a plain model (HF ``Trainer.training_step``): ``model.train()``, the loss from
    :meth:`compute_loss`, weighted by the micro-batch's share of the accumulation window (HF: divided by
    ``gradient_accumulation_steps``), backward through the strategy; returns the weighted loss, detached.
    Override it in a subclass (e.g. to add a penalty or scale the loss); call ``loss.backward()`` or
    ``super().training_step``. ``num_items_in_batch`` is what HF passes (see
    :class:`~taskfit.fit.hf_overrides.HFTrainingStep`), for an override's own use; this default step leaves it
    out of :meth:`compute_loss` (which gets None), since the window weight already normalises the loss (HF
    instead skips its division by the accumulation steps when the model or ``compute_loss_func`` takes the
    count: the same gradients, a documented difference)."""
    return self._hf.training_step(model, inputs)


def prediction_step(self, model: nn.Module, inputs: Any, prediction_loss_only: bool,
                    ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
    """``(loss, logits, labels)`` of one evaluation batch (HF ``Trainer.prediction_step``): the loss from
    :meth:`compute_loss` when the batch has every label (None otherwise), the outputs other than the loss and
    ``ignore_keys`` (default the model config's ``keys_to_ignore_at_inference``) as logits (a single one
    unwrapped), the labels; with ``prediction_loss_only`` ``(loss, None, None)``. Runs under ``no_grad``."""
    return self._hf.prediction_step(model, inputs, prediction_loss_only, ignore_keys)


def _prepare_inputs(self, inputs: Any) -> Any:
    # HF's private Trainer._prepare_inputs, which step overrides often call (the batch is on the device already)
    return self._hf.prepare_inputs(inputs)


# ----------------------------------------------------------------------------------------- outputs ---
def save_model(self, output_dir: str | None = None, *, merge_adapters: bool = False) -> str:
    """Write the trained model (safetensors weights + config, and the processing class) to ``output_dir``
    (default ``args.output_dir``) on rank zero; returns the folder (F-CORE-7, HF ``save_model``). A PEFT model
    writes its adapters (as HF); ``merge_adapters=True`` writes instead the full weights of a copy merged with
    PEFT's ``merge_and_unload`` (the base architecture; the live model keeps its adapters).

    Raises:
        ValueError: no model attached yet; ``merge_adapters=True`` without a PEFT model that can merge.
    """
    return outputs.save_model(self, output_dir, merge_adapters)


def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
    """Print ``metrics`` as an aligned table on rank zero (HF ``log_metrics`` with ``metrics_format``)."""
    outputs.log_metrics(split, metrics)


def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
    """Write ``{split}_results.json`` (and merge into ``all_results.json``) under ``output_dir`` on rank zero
    (HF ``save_metrics``)."""
    outputs.save_metrics(self.args.output_dir, split, metrics, combined)


def save_state(self) -> None:
    """Write ``trainer_state.json`` (the loop state, HF ``save_state``) under ``output_dir`` (path or URL) on
    rank zero."""
    outputs.save_state(self)


def create_model_card(self, language: str | None = None, license: str | None = None, tags: Any = None,
                      model_name: str | None = None, finetuned_from: str | None = None, tasks: Any = None,
                      dataset_tags: Any = None, dataset: Any = None, dataset_args: Any = None) -> str:
    """Write ``README.md`` under ``output_dir`` on rank zero and return it (HF ``create_model_card``'s
    keywords; see :meth:`taskfit.fit.hf_api.HFTrainerAPI.create_model_card`)."""
    return self._api.create_model_card(language, license, tags, model_name, finetuned_from, tasks,
                                       dataset_tags, dataset, dataset_args)


def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                token: str | None = None, revision: str | None = None, private: bool | None = None,
                **kwargs: Any) -> list[str]:
    """Publish the model, card and metrics now and wait; returns the failed pushes (HF ``push_to_hub``'s
    signature; see :meth:`taskfit.fit.hf_api.HFTrainerAPI.push_to_hub`)."""
    return self._api.push_to_hub(commit_message, blocking, token, revision, private, **kwargs)
