"""F-CORE-4: FitArguments' grouped setters and the "not implemented yet" gate (split from test_arguments.py)."""

import pytest

from taskfit.arguments.fit_arguments import FitArguments


# ---------------------------------------------------------------------------------------------------------------
# Grouped setters


def test_set_training():
    """F-CORE-4: set_training (HF parameter names) sets the training options and do_train, returns self."""
    a = FitArguments()
    assert a.set_training(learning_rate=1e-4, batch_size=16, weight_decay=0.01, num_epochs=2, max_steps=50,
                          gradient_accumulation_steps=4, seed=1) is a
    assert (a.do_train, a.learning_rate, a.per_device_train_batch_size, a.weight_decay, a.num_train_epochs,
            a.max_steps, a.gradient_accumulation_steps, a.seed, a.gradient_checkpointing) == (
        True, 1e-4, 16, 0.01, 2, 50, 4, 1, False)


def test_set_evaluate_and_testing():
    """F-CORE-4: set_evaluate / set_testing (HF names); do_eval follows the strategy, do_predict is set."""
    a = FitArguments().set_evaluate(strategy="steps", steps=100, batch_size=32, accumulation_steps=4, delay=2,
                                    loss_only=True)
    assert (a.eval_strategy, a.do_eval, a.eval_steps, a.per_device_eval_batch_size, a.eval_accumulation_steps,
            a.eval_delay, a.prediction_loss_only) == ("steps", True, 100, 32, 4, 2, True)
    assert a.set_evaluate(strategy="no").do_eval is False
    with pytest.raises(ValueError, match="eval_strategy='steps' needs eval_steps > 0"):
        FitArguments().set_evaluate(strategy="steps", steps=0)
    with pytest.raises(ValueError, match="jit_mode_eval=True is not supported"):
        FitArguments().set_testing(jit_mode=True)
    b = FitArguments().set_testing(batch_size=4, loss_only=True)
    assert (b.do_predict, b.per_device_eval_batch_size, b.prediction_loss_only) == (True, 4, True)


def test_set_save_logging_push():
    """F-CORE-4: set_save / set_logging (with HF's setter defaults) / set_push_to_hub."""
    a = FitArguments().set_save(strategy="epoch", steps=10, total_limit=2, on_each_node=True)
    assert (a.save_strategy, a.save_steps, a.save_total_limit, a.save_on_each_node) == ("epoch", 10, 2, True)
    b = FitArguments().set_logging(strategy="steps", steps=5, report_to="csv", level="info", first_step=True)
    assert (b.logging_strategy, b.logging_steps, b.report_to, b.log_level, b.logging_first_step) == (
        "steps", 5, ["csv"], "info", True)
    assert (b.logging_nan_inf_filter, b.log_on_each_node, b.log_level_replica) == (False, False, "passive")
    assert FitArguments().set_logging().report_to == []
    c = FitArguments().set_push_to_hub("me/model", strategy="end", token="t", private_repo=True, always_push=True)
    assert (c.push_to_hub, c.hub_model_id, c.hub_strategy, c.hub_token, c.hub_private_repo, c.hub_always_push) == (
        True, "me/model", "end", "t", True, True)


def test_set_optimizer_scheduler_dataloader():
    """F-CORE-4: set_optimizer / set_lr_scheduler / set_dataloader (HF names)."""
    a = FitArguments().set_optimizer(name="sgd", learning_rate=0.1, weight_decay=1e-4, beta1=0.8, beta2=0.99,
                                     epsilon=1e-6, args="momentum=0.9")
    assert (a.optim, a.learning_rate, a.weight_decay, a.adam_beta1, a.adam_beta2, a.adam_epsilon, a.optim_args) == (
        "sgd", 0.1, 1e-4, 0.8, 0.99, 1e-6, {"momentum": 0.9})
    b = FitArguments().set_lr_scheduler(name="cosine", num_epochs=5, max_steps=200, warmup_steps=0.05)
    assert (b.lr_scheduler_type, b.num_train_epochs, b.max_steps, b.warmup_ratio, b.warmup_steps) == (
        "cosine", 5, 200, 0.0, 0.05)
    with pytest.warns(FutureWarning, match="warmup_ratio is deprecated .* use warmup_steps=0.05"):
        b4 = FitArguments().set_lr_scheduler(name="cosine", warmup_ratio=0.05)  # the 4.x parameter still works
    assert (b4.warmup_ratio, b4.warmup_steps, b4.get_warmup_steps(100)) == (0.0, 0.05, 5)
    c = FitArguments().set_dataloader(train_batch_size=4, eval_batch_size=2, drop_last=True, num_workers=2,
                                      pin_memory=False, persistent_workers=True, prefetch_factor=4, sampler_seed=3)
    assert (c.per_device_train_batch_size, c.per_device_eval_batch_size, c.dataloader_drop_last,
            c.dataloader_num_workers, c.dataloader_pin_memory, c.dataloader_persistent_workers,
            c.dataloader_prefetch_factor, c.data_seed) == (4, 2, True, 2, False, True, 4, 3)


def test_setters_revalidate_atomically():
    """F-CORE-4: a setter with a bad value raises and leaves the object unchanged; setters chain."""
    a = FitArguments().set_training(learning_rate=1e-3).set_save(strategy="no")
    before = a.to_dict()
    with pytest.raises(ValueError, match=r"Unknown lr_scheduler_type 'cosin'\. Did you mean \"cosine\""):
        a.set_lr_scheduler(name="cosin", max_steps=10)
    with pytest.raises(ValueError, match="dataloader_prefetch_factor can only be set"):
        a.set_dataloader(prefetch_factor=2)
    assert a.to_dict() == before


# ---------------------------------------------------------------------------------------------------------------
# The "not implemented yet" gate

#: a valid non-default value (plus what it needs) for every option that was gated until its feature landed
PENDING_SAMPLES = {
    "resume_from_checkpoint": {"resume_from_checkpoint": True},
    "save_total_limit": {"save_total_limit": 2},
    "load_best_model_at_end": {"load_best_model_at_end": True, "eval_strategy": "steps"},
    "save_only_model": {"save_only_model": True},
    "save_on_each_node": {"save_on_each_node": True},
    "restore_callback_states_from_checkpoint": {"restore_callback_states_from_checkpoint": True},
    "ignore_data_skip": {"ignore_data_skip": True},
    "save_strategy": {"save_strategy": "best", "eval_strategy": "epoch", "metric_for_best_model": "loss"},
    "fp16": {"fp16": True},
    "fp16_full_eval": {"fp16_full_eval": True},
    "bf16_full_eval": {"bf16_full_eval": True},
    "tf32": {"tf32": True},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "gradient_checkpointing_kwargs": {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    "torch_compile": {"torch_compile": True},
    "torch_compile_backend": {"torch_compile_backend": "eager"},
    "torch_compile_mode": {"torch_compile_mode": "reduce-overhead"},
    "torchdynamo": {"torchdynamo": "eager"},
    "neftune_noise_alpha": {"neftune_noise_alpha": 5.0},
    "label_smoothing_factor": {"label_smoothing_factor": 0.1},
    "auto_find_batch_size": {"auto_find_batch_size": True},
    "adafactor": {"adafactor": True},
    "optim_target_modules": {"optim_target_modules": ["attn"]},
    "debug": {"debug": "tpu_metrics_debug"},
    "precision": {"precision": "16-mixed"},
    "fsdp": {"fsdp": "full_shard"},
    "fsdp_config": {"fsdp_config": {"min_num_params": 10}},
    "fsdp_min_num_params": {"fsdp_min_num_params": 10},
    "fsdp_transformer_layer_cls_to_wrap": {"fsdp_transformer_layer_cls_to_wrap": "Block"},
    "deepspeed": {"deepspeed": "ds.json"},
    "accelerator_config": {"accelerator_config": {"split_batches": True}},
    "dispatch_batches": {"dispatch_batches": True},
    "split_batches": {"split_batches": True},
    "num_nodes": {"num_nodes": 2},
    "use_mps_device": {"use_mps_device": True},
    "tpu_num_cores": {"tpu_num_cores": 8},
    "tpu_metrics_debug": {"tpu_metrics_debug": True},
    "predict_with_generate": {"predict_with_generate": True},
    "generation_max_length": {"generation_max_length": 64},
    "generation_num_beams": {"generation_num_beams": 4},
    "generation_config": {"generation_config": "gen.json"},
    "sortish_sampler": {"sortish_sampler": True},
    "include_tokens_per_second": {"include_tokens_per_second": True},
    "include_num_input_tokens_seen": {"include_num_input_tokens_seen": True},
    "skip_memory_metrics": {"skip_memory_metrics": False},
    "report_to": {"report_to": ["csv", "tensorboard"]},
    "push_to_hub": {"push_to_hub": True},
    "hub_model_id": {"hub_model_id": "me/model"},
    "hub_strategy": {"hub_strategy": "end"},
    "hub_token": {"hub_token": "secret"},
    "hub_private_repo": {"hub_private_repo": True},
    "hub_always_push": {"hub_always_push": True},
    "push_to_hub_model_id": {"push_to_hub_model_id": "model"},
    "push_to_hub_organization": {"push_to_hub_organization": "org"},
    "push_to_hub_token": {"push_to_hub_token": "secret"},
}


@pytest.mark.parametrize("name", sorted(PENDING_SAMPLES))
def test_every_once_gated_option_is_accepted_and_stored(name):
    """F-CORE-4: every option that was gated while its feature was pending (the features landed with issues
    #3-#9) is accepted with a non-default value and kept (a deprecated spelling in the option it moved to);
    credentials never appear in the repr."""
    a = FitArguments(**PENDING_SAMPLES[name])
    assert a != FitArguments()
    assert "secret" not in repr(a)


@pytest.mark.parametrize("kwargs", [
    {"bf16": True}, {"precision": "bf16-mixed"}, {"precision": "bf16-true"}, {"precision": "64-true"},
    {"precision": "32-true"}, {"save_strategy": "epoch"}, {"save_strategy": "no"}, {"report_to": "csv"},
    {"report_to": "none"}, {"report_to": "all"}, {"num_nodes": 1}, {"skip_memory_metrics": True},
    {"hub_strategy": "every_save"}, {"eval_on_start": True}, {"use_cpu": True}, {"ddp_backend": "gloo"},
    {"overwrite_output_dir": True}, {"do_train": True}, {"max_grad_norm": 0.5}, {"group_by_length": True},
    {"optim": "sgd"}, {"lr_scheduler_type": "cosine", "warmup_steps": 10}, {"full_determinism": True},
    {"eval_strategy": "steps", "eval_steps": 10, "metric_for_best_model": "accuracy"},
    {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 2, "dataloader_persistent_workers": True},
])
def test_core_options_are_accepted(kwargs):
    """F-CORE-4: options implemented by the core are accepted and stored."""
    a = FitArguments(**kwargs)
    assert all(getattr(a, k) is not None for k in kwargs)


@pytest.mark.parametrize("alias, expected", [("bf16", "bf16-mixed"), ("16", "16-mixed"), (32, "32-true"),
                                             ("64", "64-true")])
def test_precision_accepts_lightning_short_names_F_PREC_1(alias, expected):
    """F-CORE-4 / F-PREC-1: Lightning's short precision names map onto the full plugin names."""
    from taskfit.arguments.fit_arguments import FitArguments

    assert FitArguments(precision=alias).resolved_precision() == expected
