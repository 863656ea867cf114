"""The options the connector builds a strategy from (F-CORE-4, F-STRAT-2, F-ENGINE-1): ``Fit`` reads them from its
``FitArguments``, ``Engine`` builds them from its keyword values without a ``FitArguments``; both give the same
options, the same strategy settings and the same errors."""

from __future__ import annotations

import pickle
from dataclasses import fields

import pytest
from taskfit import Engine, FitArguments
from taskfit.arguments.strategy_options import ScheduleOptions, StrategyOptions
from taskfit.connector import resolve_components, strategy_settings
from taskfit.strategies import DDPStrategy
from taskfit.strategies.settings import DDPSettings


def test_F_CORE_4_strategy_option_defaults_are_fit_arguments_defaults():
    """Every option keeps ``FitArguments``' name and default, so an option means the same under Fit and Engine."""
    assert StrategyOptions.from_arguments(FitArguments()) == StrategyOptions()
    names = set(FitArguments.field_names())
    assert set(StrategyOptions.option_names()) <= names
    assert len(StrategyOptions.option_names()) == len(fields(StrategyOptions)) - 1 + len(fields(ScheduleOptions))


def test_F_CORE_4_hf_flags_fold_into_the_precision_and_use_cpu():
    assert StrategyOptions.from_arguments(FitArguments(bf16=True)).precision == "bf16-mixed"
    assert StrategyOptions.from_arguments(FitArguments(fp16=True)).resolved_precision() == "16-mixed"
    assert StrategyOptions().resolved_precision() == "32-true"
    with pytest.warns(FutureWarning):
        assert StrategyOptions.from_arguments(FitArguments(no_cuda=True)).use_cpu is True


VALUES = [
    {"devices": "2", "strategy": "ddp", "ddp_timeout": "60", "ddp_backend": "gloo", "ddp_static_graph": "true"},
    {"fsdp": "full_shard auto_wrap", "fsdp_config": '{"min_num_params": 10}', "precision": "bf16"},
    {"fsdp": True, "deepspeed": '{"zero_optimization": {"stage": 2}}', "devices": [0, 1], "precision": 16},
    {"learning_rate": "1e-3", "lr_scheduler_kwargs": '{"power": 2.0}', "warmup_steps": 0.1, "optim": "adamw_torch"},
]


@pytest.mark.parametrize("values", VALUES)
def test_F_ENGINE_1_values_normalise_as_fit_arguments_normalise_them(values):
    """Text from a command line, JSON strings, Lightning's precision aliases and ``fsdp`` words: the options built
    from keyword values equal the ones read from ``FitArguments`` built with the same values."""
    assert StrategyOptions.from_values(**values) == StrategyOptions.from_arguments(FitArguments(**values))


@pytest.mark.parametrize("values", [
    {"fsdp": "full_shard shard_grad_op"}, {"fsdp": "ful_shard"}, {"ddp_backend": "glo"}, {"devices": 0},
    {"ddp_timeout": -1}, {"precision": "bf16-mixd"}, {"learning_rate": "fast"}, {"optim": "adamw_torh"},
    {"lr_scheduler_kwargs": "[1]"}, {"gradient_accumulation_steps": 0},
])
def test_F_ENGINE_1_bad_values_raise_the_fit_arguments_error(values):
    with pytest.raises(ValueError) as fit_error:
        FitArguments(**values)
    with pytest.raises(type(fit_error.value)) as options_error:
        StrategyOptions.from_values(**values)
    assert str(options_error.value) == str(fit_error.value)


def test_F_STRAT_2_settings_from_options_equal_settings_from_arguments():
    """The connector resolves the same typed settings from either form; the DeepSpeed schedule callables carry
    the small ``ScheduleOptions`` (pickled into spawned workers), not the whole arguments."""
    args = FitArguments(strategy="ddp", devices=2, ddp_timeout=90, ddp_find_unused_parameters=True)
    options = StrategyOptions.from_arguments(args)
    assert strategy_settings(DDPStrategy, options) == strategy_settings(DDPStrategy, args) == DDPSettings(
        timeout=90, find_unused_parameters=True)
    assert resolve_components(options).settings == resolve_components(args).settings
    assert b"FitArguments" not in pickle.dumps(options)


def test_F_ENGINE_1_engine_builds_its_strategy_without_fit_arguments(tmp_path):
    """``Engine``'s options become the same strategy settings ``Fit`` gets for the same options; its own options
    (loggers) are kept apart; a ``FitArguments`` option of the training loop is refused, naming it and the
    Engine's options."""
    engine = Engine(accelerator="cpu", strategy="ddp", devices=2, ddp_timeout=90, ddp_bucket_cap_mb=5,
                    report_to="csv", logging_dir=str(tmp_path / "logs"))
    fit_side = resolve_components(FitArguments(accelerator="cpu", strategy="ddp", devices=2, ddp_timeout=90,
                                               ddp_bucket_cap_mb=5))
    assert engine.strategy.settings == fit_side.settings and not hasattr(engine, "args")
    assert isinstance(engine.options, StrategyOptions) and engine.options.schedule.max_grad_norm == 0.0
    assert engine.engine_options.report_to == ["csv"]
    assert engine.engine_options.resolved_logging_dir == str(tmp_path / "logs")
    with pytest.raises(ValueError, match=r"Engine does not read 'num_train_epochs'.*Engine options: .*ddp_timeout"):
        Engine(accelerator="cpu", num_train_epochs=3)
    with pytest.raises(ValueError, match=r"devices=0 is invalid"):
        Engine(accelerator="cpu", devices=0)
