"""The HF ``transformers.Trainer`` members of ``Fit`` that only read or manage what ``Fit`` holds: the callback
list (``callback_handler``, ``add_callback``, ``pop_callback``, ``remove_callback``), the optimizer read-outs
(``get_learning_rates``, ``get_optimizer_group``, ``get_decay_parameter_names``), the model read-outs
(``model_wrapped``, ``get_num_trainable_parameters``) and the model card / push (``create_model_card``,
``push_to_hub`` with HF's keywords). :class:`HFTrainerAPI` is a base class of :class:`taskfit.Fit`."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from torch import nn

from taskfit.callbacks.base import HookRunner
from taskfit.fit import outputs
from taskfit.optim.optimizers import get_decay_parameter_names as _decay_names


class CallbackHandler:
    """A live view of a ``Fit``'s callbacks with HF ``transformers.trainer_callback.CallbackHandler``'s public
    members: ``callbacks`` (the ``Fit``'s own list, not a copy), ``callback_list`` (class names, one a line),
    ``add_callback``/``pop_callback``/``remove_callback`` (the ``Fit``'s), the objects events are called with
    (``model``, ``processing_class``, ``optimizer``, ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader``)
    and ``call_event``/``on_<event>(args, state, control, **kwargs)``, which call that method of every callback
    that has it with HF's keyword arguments.

    Args:
        fit (Fit): the owner.
    """

    def __init__(self, fit: Any) -> None:
        self._fit = fit

    @property
    def callbacks(self) -> list[Any]:
        return self._fit.callbacks

    @property
    def callback_list(self) -> str:
        return "\n".join(type(cb).__name__ for cb in self._fit.callbacks)

    def add_callback(self, callback: Any) -> None:
        self._fit.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self._fit.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self._fit.remove_callback(callback)

    def __getattr__(self, name: str) -> Any:
        if name in ("model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"):
            return self._fit._api.event_kwargs()[name]
        if name.startswith("on_"):
            return partial(self.call_event, name)
        raise AttributeError(f"'CallbackHandler' object has no attribute {name!r}")

    def call_event(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Call ``event`` on every callback that has it, with HF's keyword arguments plus ``kwargs``; a returned
        control object replaces ``control`` for the next callback (as HF). Returns the control."""
        kw = {**self._fit._api.event_kwargs(), **kwargs}
        for cb in list(self._fit.callbacks):
            fn = getattr(cb, event, None)
            if fn is not None:
                result = fn(args, state, control, **kw)
                control = result if result is not None else control
        return control


def warn_if_duplicate(callbacks: list[Any], cb: Any) -> None:
    """Warn (HF's words, on HF's ``transformers.trainer_callback`` logger, which scripts written for transformers
    watch) when ``callbacks`` already holds a callback of ``cb``'s class, as HF's ``CallbackHandler.add_callback``."""
    if type(cb) in [type(c) for c in callbacks]:
        names = "\n".join(type(c).__name__ for c in callbacks)
        logging.getLogger("transformers.trainer_callback").warning(
            f"You are adding a {type(cb)} to the callbacks of this Trainer, but there is already one. The current"
            f"list of callbacks is\n:{names}")


class HFTrainerAPI:
    """The bodies of HF ``Trainer`` members of :class:`taskfit.Fit` (see the module docstring; ``Fit``'s methods of
    the same names delegate here). Reads ``Fit``'s ``callbacks``, ``model``, ``optimizer``, ``processing_class``,
    ``args`` and runs.

    Args:
        fit (Fit): the owner.
    """

    def __init__(self, fit: Any) -> None:
        self.fit = fit

    # ------------------------------------------------------------------------------------- callbacks ---
    def callback_handler(self) -> CallbackHandler:
        """HF ``Trainer.callback_handler``: a live view of ``fit.callbacks`` (see :class:`CallbackHandler`)."""
        return CallbackHandler(self.fit)

    def hook_runner(self, module: Any = None) -> HookRunner:
        # every HF event gets HF's keyword arguments (model, optimizer, loaders, ...) from this Fit
        return HookRunner(self.fit.callbacks, module, hf_kwargs=self.event_kwargs)

    def event_kwargs(self) -> dict[str, Any]:
        """What HF's ``CallbackHandler.call_event`` passes every event: ``model``, ``processing_class``,
        ``optimizer``, ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader`` (None where not built yet)."""
        run = self.fit._run
        if run is None:
            return {"model": self.fit.model, "processing_class": self.fit.processing_class, "optimizer": None,
                    "lr_scheduler": None, "train_dataloader": None, "eval_dataloader": None}
        loaders = list(run.eval_loaders.values()) if run.eval_loaders else []
        return {**run.hf_kwargs(), "processing_class": self.fit.processing_class,
                "eval_dataloader": loaders[-1] if loaders else None}

    def add_callback(self, callback: Any) -> None:
        """Add a callback instance or class (instantiated without arguments), as HF ``add_callback``; adding a
        second callback of one class warns as HF does (on HF's ``transformers.trainer_callback`` logger)."""
        cb = callback() if isinstance(callback, type) else callback
        warn_if_duplicate(self.fit.callbacks, cb)
        self.fit.callbacks.append(cb)
        self.fit._hooks = self.hook_runner(self.fit.module)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback equal to ``callback`` or of that class (None if absent), as HF
        ``pop_callback``."""
        for cb in self.fit.callbacks:
            if cb is callback or (isinstance(callback, type) and isinstance(cb, callback)):
                self.fit.callbacks.remove(cb)
                self.fit._hooks = self.hook_runner(self.fit.module)
                return cb
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove the first callback equal to ``callback`` or of that class (HF ``remove_callback``)."""
        self.pop_callback(callback)

    # ----------------------------------------------------------------------------- model / optimizer ---
    def model_wrapped(self) -> Any:
        """HF ``Trainer.model_wrapped``: the model as the strategy wrapped it for the current or last run (DDP,
        FSDP, a DeepSpeed engine; the model itself on one device); before any run, :attr:`model`."""
        run = self.fit._run
        if run is None:
            return self.fit.model
        return run.wrapped if run.wrapped is not None else run.model

    def get_num_trainable_parameters(self) -> int:
        """Number of parameters with ``requires_grad`` of :attr:`model` (HF ``get_num_trainable_parameters``);
        0 without a model."""
        model = self.fit.model
        return sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None else 0

    def _require_optimizer(self) -> Any:
        optimizer = self.fit.optimizer
        if optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        return optimizer

    def get_learning_rates(self) -> list[float]:
        """The learning rate of each parameter group of :attr:`optimizer` (HF ``get_learning_rates``).

        Raises:
            ValueError: no optimizer yet (HF's message).
        """
        return [group["lr"] for group in self._require_optimizer().param_groups]

    def get_optimizer_group(self, param: Any = None) -> Any:
        """The parameter group (a dict) of :attr:`optimizer` holding ``param``, or, without ``param``, every
        group's parameter list (HF ``get_optimizer_group``).

        Raises:
            ValueError: no optimizer yet (HF's message).
        """
        optimizer = self._require_optimizer()
        if param is not None:
            for group in optimizer.param_groups:
                if any(p is param for p in group["params"]):
                    return group
        return [group["params"] for group in optimizer.param_groups]

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of ``model``'s parameters that get weight decay: all but biases and normalisation layers' (HF
        ``get_decay_parameter_names``; :func:`taskfit.optim.optimizers.get_decay_parameter_names`)."""
        return _decay_names(model)

    # ------------------------------------------------------------------------------ card / publishing ---
    def create_model_card(self, language: str | None = None, license: str | None = None,
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> str:
        """Write ``README.md`` (the model card, see :func:`taskfit.checkpoint.publish.create_model_card`) under
        ``output_dir`` on rank zero and return its text. HF ``Trainer.create_model_card``'s keywords: ``language``,
        ``license``, ``tasks``, ``dataset_tags``, ``dataset_args`` go to the card's metadata block."""
        meta = {"language": language, "license": license, "tasks": tasks, "dataset_tags": dataset_tags,
                "dataset_args": dataset_args}
        return outputs.create_model_card(self.fit, model_name, dataset, finetuned_from, tags, meta)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> list[str]:
        """Publish the model, card and metrics now to ``hub_model_id`` (HF ``push_to_hub``; see
        :mod:`taskfit.checkpoint.publish`) and wait for it; returns the failed pushes (empty when it worked).
        ``kwargs`` are :meth:`create_model_card`'s (HF passes them to the card too); ``token`` overrides
        ``hub_token``. ``commit_message``, ``revision``, ``private`` and ``blocking=False`` are accepted for HF's
        signature: taskfit's targets are fsspec folders (no commits or revisions; ``hub_private_repo`` sets the
        access) and the push always completes before returning (docs/hf.md)."""
        return outputs.push_to_hub(self.fit, kwargs.pop("dataset", None), card=kwargs, token=token)
