"""The grouped HF-style setters of `FitArguments` (``set_training``, ``set_evaluate``, ...), as the
:class:`ArgumentSetters` mixin. Normalisation and validation live in :mod:`taskfit.arguments.validation`; its
tables and helpers are re-exported here for the existing import paths.
"""

from typing import Any

from taskfit.arguments.validation import (  # noqa: F401 - re-exported
    BUILT_LOGGERS, DDP_BACKENDS, DEBUG_OPTIONS, FSDP_OPTIONS, HALF_PRECISION_BACKENDS, HUB_STRATEGIES,
    INTERVAL_STRATEGIES, LOG_LEVELS, LR_SCHEDULERS, OPTIMIZERS, PRECISION_ALIASES, PRECISIONS, REPORT_TO,
    SAVE_STRATEGIES, TRAIN_SAMPLING_STRATEGIES, field_kinds, installed_loggers,
    normalize_and_validate,
)


class ArgumentSetters:
    """Grouped setters of :class:`~taskfit.arguments.fit_arguments.FitArguments`, with the parameter names of HF
    ``TrainingArguments.set_*`` (transformers 5.x; the 4.x parameters ``jit_mode`` and ``warmup_ratio`` are
    still accepted). Each applies its values atomically (a validated copy first, so
    a bad value leaves the object unchanged) and returns ``self`` for chaining::

        args = FitArguments().set_training(learning_rate=1e-4, batch_size=16).set_save(strategy="epoch")

    Raises (every setter):
        ValueError: as ``FitArguments`` construction (bad value, conflict, unsupported option).
    """

    def _apply(self, **changes: Any) -> Any:  # implemented by FitArguments
        raise NotImplementedError

    def _normalize_and_validate(self) -> None:
        normalize_and_validate(self)

    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1,
                     seed: int = 42, activation_checkpointing: bool = False,
                     gradient_checkpointing: bool | None = None) -> Any:
        """Basic training options; also sets ``do_train=True`` (mirrors ``TrainingArguments.set_training``).

        Args:
            learning_rate: initial (peak) learning rate. batch_size: per-device training batch (samples).
            weight_decay: decoupled weight decay. num_epochs: ``num_train_epochs``. max_steps: optimizer steps,
            overrides epochs when > 0. gradient_accumulation_steps: micro-batches per step. seed: random seed.
            activation_checkpointing: recompute activations in backward. gradient_checkpointing: its
            deprecated HF name (used when given).
        """
        if gradient_checkpointing is not None:
            activation_checkpointing = gradient_checkpointing
        return self._apply(do_train=True, learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                           weight_decay=weight_decay, num_train_epochs=num_epochs, max_steps=max_steps,
                           gradient_accumulation_steps=gradient_accumulation_steps, seed=seed,
                           activation_checkpointing=activation_checkpointing)

    def set_evaluate(self, strategy: str = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None, loss_only: bool = False,
                     jit_mode: bool = False) -> Any:
        """Evaluation options; ``do_eval`` becomes ``strategy != "no"`` (mirrors ``set_evaluate``).

        Args:
            strategy: ``no | steps | epoch``. steps: optimizer steps between evaluations (> 0 for "steps").
            batch_size: per-device eval batch (samples). accumulation_steps: ``eval_accumulation_steps``.
            delay: ``eval_delay`` (epochs or steps). loss_only: ``prediction_loss_only``. jit_mode:
            ``jit_mode_eval`` (not supported: True raises ValueError).
        """
        return self._apply(eval_strategy=strategy, do_eval=strategy != "no", eval_steps=steps,
                           per_device_eval_batch_size=batch_size, eval_accumulation_steps=accumulation_steps,
                           eval_delay=0 if delay is None else delay, prediction_loss_only=loss_only,
                           jit_mode_eval=jit_mode)

    def set_testing(self, batch_size: int = 8, loss_only: bool = False, jit_mode: bool = False) -> Any:
        """Test/prediction options; also sets ``do_predict=True`` (mirrors ``set_testing``).

        Args:
            batch_size: per-device eval batch (samples). loss_only: ``prediction_loss_only``. jit_mode:
            ``jit_mode_eval`` (not supported).
        """
        return self._apply(do_predict=True, per_device_eval_batch_size=batch_size, prediction_loss_only=loss_only,
                           jit_mode_eval=jit_mode)

    def set_save(self, strategy: str = "steps", steps: int = 500, total_limit: int | None = None,
                 on_each_node: bool = False) -> Any:
        """Checkpoint options (mirrors ``set_save``).

        Args:
            strategy: ``no | steps | epoch | best``. steps: optimizer steps between saves. total_limit:
            ``save_total_limit``. on_each_node: ``save_on_each_node``.
        """
        return self._apply(save_strategy=strategy, save_steps=steps, save_total_limit=total_limit,
                           save_on_each_node=on_each_node)

    def set_logging(self, strategy: str = "steps", steps: int = 500, report_to: str | list[str] = "none",
                    level: str = "passive", first_step: bool = False, nan_inf_filter: bool = False,
                    on_each_node: bool = False, replica_level: str = "passive") -> Any:
        """Logging options, with HF's setter defaults (``report_to="none"``, ``nan_inf_filter=False``,
        ``on_each_node=False``, ``replica_level="passive"``; mirrors ``set_logging``).

        Args:
            strategy: ``no | steps | epoch``. steps: optimizer steps between logs. report_to: logger names.
            level / replica_level: ``log_level`` / ``log_level_replica``. first_step: ``logging_first_step``.
            nan_inf_filter: ``logging_nan_inf_filter``. on_each_node: ``log_on_each_node``.
        """
        return self._apply(logging_strategy=strategy, logging_steps=steps, report_to=report_to, log_level=level,
                           logging_first_step=first_step, logging_nan_inf_filter=nan_inf_filter,
                           log_on_each_node=on_each_node, log_level_replica=replica_level)

    def set_push_to_hub(self, model_id: str, strategy: str = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False,
                        revision: str | None = None) -> Any:
        """Publishing options; also sets ``push_to_hub=True`` (mirrors ``set_push_to_hub``).

        Args:
            model_id: ``hub_model_id``. strategy: ``end | every_save | checkpoint | all_checkpoints``. token:
            ``hub_token``. private_repo: ``hub_private_repo``. always_push: ``hub_always_push``. revision:
            ``hub_revision`` (not supported: a value raises ValueError).
        """
        return self._apply(push_to_hub=True, hub_model_id=model_id, hub_strategy=strategy, hub_token=token,
                           hub_private_repo=private_repo, hub_always_push=always_push, hub_revision=revision)

    def set_optimizer(self, name: str = "adamw_torch", learning_rate: float = 5e-5, weight_decay: float = 0,
                      beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                      args: str | dict | None = None) -> Any:
        """Optimizer options (mirrors ``set_optimizer``).

        Args:
            name: ``optim``. learning_rate, weight_decay: as the options. beta1 / beta2 / epsilon: ``adam_beta1``
            / ``adam_beta2`` / ``adam_epsilon``. args: ``optim_args`` (dict, JSON or ``"k=v,k2=v2"``).
        """
        return self._apply(optim=name, learning_rate=learning_rate, weight_decay=weight_decay, adam_beta1=beta1,
                           adam_beta2=beta2, adam_epsilon=epsilon, optim_args=args)

    def set_lr_scheduler(self, name: str = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0, warmup_ratio: float = 0) -> Any:
        """Learning-rate schedule options (mirrors ``set_lr_scheduler``).

        Args:
            name: ``lr_scheduler_type``. num_epochs: ``num_train_epochs``. max_steps: optimizer steps.
            warmup_steps: steps when >= 1, a ratio of the total steps when in (0, 1). warmup_ratio: the 4.x
            spelling of that ratio (deprecated; ``FutureWarning``).
        """
        return self._apply(lr_scheduler_type=name, num_train_epochs=num_epochs, max_steps=max_steps,
                           warmup_ratio=warmup_ratio, warmup_steps=warmup_steps)

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, auto_find_batch_size: bool = False,
                       multiprocessing_context: str | None = None, in_order: bool = True,
                       ignore_data_skip: bool = False, sampler_seed: int | None = None) -> Any:
        """DataLoader options (mirrors ``set_dataloader``).

        Args:
            train_batch_size / eval_batch_size: per-device batches (samples). drop_last: ``dataloader_drop_last``.
            num_workers: worker processes. pin_memory / persistent_workers / prefetch_factor: ``dataloader_*``
            (prefetch needs workers > 0). multiprocessing_context / in_order: ``dataloader_*``.
            auto_find_batch_size, ignore_data_skip: as the options.
            sampler_seed: ``data_seed``.
        """
        return self._apply(per_device_train_batch_size=train_batch_size, per_device_eval_batch_size=eval_batch_size,
                           dataloader_drop_last=drop_last, dataloader_num_workers=num_workers,
                           dataloader_pin_memory=pin_memory, dataloader_persistent_workers=persistent_workers,
                           dataloader_prefetch_factor=prefetch_factor,
                           dataloader_multiprocessing_context=multiprocessing_context, dataloader_in_order=in_order,
                           auto_find_batch_size=auto_find_batch_size,
                           ignore_data_skip=ignore_data_skip, data_seed=sampler_seed)
