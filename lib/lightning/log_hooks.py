"""Lightning's table of the hooks in which ``self.log`` may be called, with the ``on_step``/``on_epoch`` values each
allows and its defaults (``lightning.pytorch.trainer.connectors.logger_connector.fx_validator._FxValidator``); the
door's :class:`~taskfit.loops.policy.LoopPolicy` carries it to ``self.log``."""

from __future__ import annotations

__all__ = ["LOG_HOOKS"]

_ANY = (False, True)
_STEP = (_ANY, _ANY, True, False)  # per-batch training hooks: on_step by default
_EVAL_STEP = (_ANY, _ANY, False, True)  # per-batch evaluation hooks: on_epoch by default
_EPOCH = ((False,), (True,), False, True)  # start / epoch hooks: epoch values only

_CANNOT = ("lr_scheduler_step", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
           "on_train_end", "on_validation_end", "on_test_end", "on_predict_start", "on_predict_end",
           "on_predict_epoch_start", "on_predict_epoch_end", "on_before_batch_transfer", "transfer_batch_to_device",
           "on_after_batch_transfer", "on_predict_batch_start", "on_predict_batch_end", "on_exception", "state_dict",
           "on_save_checkpoint", "on_load_checkpoint", "load_state_dict", "setup", "teardown",
           "configure_sharded_model", "configure_model", "predict_step", "configure_optimizers", "train_dataloader",
           "val_dataloader", "test_dataloader", "prepare_data", "configure_callbacks", "on_validation_model_zero_grad",
           "on_validation_model_eval", "on_test_model_eval", "on_validation_model_train", "on_test_model_train")
_STEPS = ("on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step", "optimizer_step",
          "configure_gradient_clipping", "clip_gradients", "on_before_zero_grad", "optimizer_zero_grad",
          "on_train_batch_start", "on_train_batch_end", "training_step")
_EVAL_STEPS = ("on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
               "validation_step", "test_step")
_EPOCHS = ("on_train_start", "on_validation_start", "on_test_start", "on_train_epoch_start", "on_train_epoch_end",
           "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end")

#: hook name -> None (``self.log`` refused there) or (allowed on_step, allowed on_epoch, default on_step, default
#: on_epoch), as Lightning 2.x; a plain dict (the policy holding it is pickled to spawned processes), never changed
LOG_HOOKS = {**dict.fromkeys(_CANNOT), **dict.fromkeys(_STEPS, _STEP), **dict.fromkeys(_EVAL_STEPS, _EVAL_STEP),
             **dict.fromkeys(_EPOCHS, _EPOCH)}
