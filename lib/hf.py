"""The Hugging Face ``Trainer`` names, for scripts written against ``transformers`` 5.x: change
``from transformers import Trainer, TrainingArguments`` into ``from taskfit.hf import Trainer, TrainingArguments``.

``Trainer`` is :class:`taskfit.Fit` with HF's positional argument order (``Trainer(model, args, data_collator,
train_dataset, eval_dataset, ...)``); every keyword, method and attribute is ``Fit``'s. ``TrainingArguments`` and
``Seq2SeqTrainingArguments`` are :class:`taskfit.FitArguments` (which holds every HF option under its HF name).
``HfArgumentParser`` is ``transformers.HfArgumentParser`` (re-exported on first use).
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from taskfit.arguments.fit_arguments import FitArguments
from taskfit.callbacks.base import Callback
from taskfit.callbacks.hf_early_stopping import EarlyStoppingCallback
from taskfit.fit.fit import Fit
from taskfit.loops.state import FitControl, FitState
from taskfit.metrics import EvalLoopOutput, EvalPrediction, PredictionOutput, TrainOutput
from taskfit.seed import enable_full_determinism, seed_everything

__all__ = ["Trainer", "Seq2SeqTrainer", "TrainingArguments", "Seq2SeqTrainingArguments", "TrainerCallback",
           "EarlyStoppingCallback", "TrainerState", "TrainerControl", "EvalPrediction", "PredictionOutput",
           "TrainOutput", "EvalLoopOutput", "set_seed", "enable_full_determinism"]

TrainingArguments = FitArguments
Seq2SeqTrainingArguments = FitArguments
TrainerState = FitState
TrainerControl = FitControl


class TrainerCallback(Callback):
    """Base class of HF-style callbacks (mirrors ``transformers.TrainerCallback``): override any of ``on_init_end``,
    ``on_train_begin``, ``on_train_end``, ``on_epoch_begin``, ``on_epoch_end``, ``on_step_begin``,
    ``on_substep_end``, ``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``, ``on_evaluate``,
    ``on_predict``, ``on_save``, ``on_log``, ``on_prediction_step``; each gets ``(args, state, control,
    **kwargs)`` and may return a control object. Only overridden hooks are called."""

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:  # HF-style signature
        return None


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (HF ``transformers.set_seed``); ``deterministic=True`` also asks for
    deterministic algorithms (``enable_full_determinism``)."""
    if deterministic:
        enable_full_determinism(seed)
    else:
        seed_everything(seed)


class Trainer(Fit):
    """:class:`taskfit.Fit` with HF ``transformers.Trainer``'s positional argument order.

    Args:
        model (nn.Module | None): the model to train (``{"loss", "logits"}``-style HF model or any module).
        args (FitArguments | None): the options (``TrainingArguments`` is the same class).
        data_collator, train_dataset, eval_dataset, processing_class, model_init, compute_loss_func,
        compute_metrics, callbacks, optimizers, optimizer_cls_and_kwargs, preprocess_logits_for_metrics:
            as HF's ``Trainer`` (see :class:`taskfit.Fit`).
        **kwargs: any other ``Fit`` keyword (``strategy=``, ``loggers=``, ...).

    Subclass override points, called where ``transformers.Trainer`` calls them (see :mod:`taskfit.fit.hf_overrides`):
    ``get_train_dataloader``, ``get_eval_dataloader``, ``get_test_dataloader``, ``create_optimizer``,
    ``create_scheduler``, ``create_optimizer_and_scheduler``, ``training_step``, ``compute_loss``,
    ``prediction_step``, ``evaluate`` (also for the evaluations during training), ``predict`` and ``log``.
    """

    def __init__(self, model: nn.Module | None = None, args: FitArguments | None = None,
                 data_collator: Callable | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, model_init: Callable | None = None,
                 compute_loss_func: Callable | None = None, compute_metrics: Callable | None = None,
                 callbacks: list[Any] | None = None, optimizers: tuple[Any, Any] = (None, None),
                 optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None,
                 preprocess_logits_for_metrics: Callable | None = None, **kwargs: Any) -> None:
        callbacks = [cb() if isinstance(cb, type) else cb for cb in (callbacks or [])]  # HF instantiates classes
        super().__init__(args, model=model, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, model_init=model_init,
                         compute_loss_func=compute_loss_func, compute_metrics=compute_metrics, callbacks=callbacks,
                         optimizers=optimizers, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
                         preprocess_logits_for_metrics=preprocess_logits_for_metrics, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """HF ``Trainer.train`` (:meth:`taskfit.Fit.train`, same arguments and errors), after writing the
        tokenizer's special token ids into the model's config as HF's ``train`` does (:func:`align_special_tokens`;
        a model from ``model_init`` is built inside the run and keeps its own ids).

        Raises:
            ValueError: ``resume_from_checkpoint=True`` with no complete checkpoint in ``output_dir``, with HF's
                message (``Fit.fit`` starts from scratch there instead, for restart loops; ``"auto"`` does so here).
        """
        if resume_from_checkpoint is True:  # HF's rule for True; "auto" keeps taskfit's restart-loop start
            from taskfit.checkpoint.resume import newest_checkpoint

            resume_from_checkpoint = newest_checkpoint(self.strategy.checkpoint_io, self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if self.model is not None and self.processing_class is not None:
            align_special_tokens(self.model, self.processing_class)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)


def align_special_tokens(model: nn.Module, processing_class: Any) -> None:
    """Write the pad/bos/eos token ids a tokenizer defines into the model's config and generation config, with
    transformers' warning naming the ids changed, as ``transformers.Trainer.train`` does before training (mirrors
    ``transformers.trainer_utils.align_special_tokens``; a tokenizer that adds a pad token thus reaches the saved
    ``config.json``). Does nothing unless ``processing_class`` is a transformers tokenizer or processor and
    ``model`` has a ``config``.

    Args:
        model (nn.Module): the model given to the Trainer.
        processing_class (Any): the Trainer's ``processing_class``.
    """
    import sys

    if "transformers" not in sys.modules or not hasattr(model, "config"):  # no transformers tokenizer exists then
        return
    from transformers import PreTrainedTokenizerBase, ProcessorMixin
    from transformers.trainer_utils import align_special_tokens as hf_align

    if isinstance(processing_class, (PreTrainedTokenizerBase, ProcessorMixin)):
        hf_align(model, processing_class)


Seq2SeqTrainer = Trainer


def __getattr__(name: str) -> Any:
    """``HfArgumentParser`` is ``transformers.HfArgumentParser`` itself, imported on first use (transformers is
    optional for taskfit); it parses ``TrainingArguments`` (taskfit's included) as it parses transformers'.

    Raises:
        ImportError: transformers is not installed (naming the package to install).
        AttributeError: any other unknown name.
    """
    if name == "HfArgumentParser":
        try:
            from transformers import HfArgumentParser
        except ImportError as err:
            raise ImportError("taskfit.hf.HfArgumentParser is transformers.HfArgumentParser: "
                              "pip install transformers") from err
        return HfArgumentParser
    raise AttributeError(f"module 'taskfit.hf' has no attribute {name!r}")
