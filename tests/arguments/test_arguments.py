"""F-CORE-4: `FitArguments`, the one dataclass of training options (HF TrainingArguments names and defaults)."""

import json
import re
from dataclasses import MISSING, fields

import pytest

from taskfit.arguments.fit_arguments import FitArguments
from taskfit.arguments.fields import field_group
from taskfit.cli.app import _GROUPS as CLI_GROUPS

GROUP_NAMES = set(CLI_GROUPS)
from taskfit.arguments.setters import installed_loggers

# Frozen copy of the transformers 4.x Seq2SeqTrainingArguments signature, as its API reference prints it;
# TrainingArguments' is the same list without the last five (seq2seq) options. The checks below hold it to the
# facts it was taken with, so the test needs nothing outside this repository.
HF_SEQ2SEQ_SIGNATURE = (
    'output_dir: str overwrite_output_dir: bool = False do_train: bool = False do_eval: bool = False '
    "do_predict: bool = False eval_strategy: Union = 'no' prediction_loss_only: bool = False "
    'per_device_train_batch_size: int = 8 per_device_eval_batch_size: int = 8 per_gpu_train_batch_size: '
    'Optional = None per_gpu_eval_batch_size: Optional = None gradient_accumulation_steps: int = 1 '
    'eval_accumulation_steps: Optional = None eval_delay: Optional = 0 learning_rate: float = 5e-05 '
    'weight_decay: float = 0.0 adam_beta1: float = 0.9 adam_beta2: float = 0.999 adam_epsilon: float = '
    '1e-08 max_grad_norm: float = 1.0 num_train_epochs: float = 3.0 max_steps: int = -1 '
    "lr_scheduler_type: Union = 'linear' lr_scheduler_kwargs: Union = <factory> warmup_ratio: float = 0.0 "
    "warmup_steps: int = 0 log_level: Optional = 'passive' log_level_replica: Optional = 'warning' "
    "log_on_each_node: bool = True logging_dir: Optional = None logging_strategy: Union = 'steps' "
    'logging_first_step: bool = False logging_steps: float = 500 logging_nan_inf_filter: bool = True '
    "save_strategy: Union = 'steps' save_steps: float = 500 save_total_limit: Optional = None "
    'save_safetensors: Optional = True save_on_each_node: bool = False save_only_model: bool = False '
    'restore_callback_states_from_checkpoint: bool = False no_cuda: bool = False use_cpu: bool = False '
    'use_mps_device: bool = False seed: int = 42 data_seed: Optional = None jit_mode_eval: bool = False '
    "use_ipex: bool = False bf16: bool = False fp16: bool = False fp16_opt_level: str = 'O1' "
    "half_precision_backend: str = 'auto' bf16_full_eval: bool = False fp16_full_eval: bool = False tf32: "
    'Optional = None local_rank: int = -1 ddp_backend: Optional = None tpu_num_cores: Optional = None '
    "tpu_metrics_debug: bool = False debug: Union = '' dataloader_drop_last: bool = False eval_steps: "
    'Optional = None dataloader_num_workers: int = 0 dataloader_prefetch_factor: Optional = None '
    'past_index: int = -1 run_name: Optional = None disable_tqdm: Optional = None remove_unused_columns: '
    'Optional = True label_names: Optional = None load_best_model_at_end: Optional = False '
    'metric_for_best_model: Optional = None greater_is_better: Optional = None ignore_data_skip: bool = '
    "False fsdp: Union = '' fsdp_min_num_params: int = 0 fsdp_config: Union = None "
    'fsdp_transformer_layer_cls_to_wrap: Optional = None accelerator_config: Union = None deepspeed: '
    "Union = None label_smoothing_factor: float = 0.0 optim: Union = 'adamw_torch' optim_args: Optional = "
    "None adafactor: bool = False group_by_length: bool = False length_column_name: Optional = 'length' "
    'report_to: Union = None ddp_find_unused_parameters: Optional = None ddp_bucket_cap_mb: Optional = '
    'None ddp_broadcast_buffers: Optional = None dataloader_pin_memory: bool = True '
    'dataloader_persistent_workers: bool = False skip_memory_metrics: bool = True '
    'use_legacy_prediction_loop: bool = False push_to_hub: bool = False resume_from_checkpoint: Optional '
    "= None hub_model_id: Optional = None hub_strategy: Union = 'every_save' hub_token: Optional = None "
    'hub_private_repo: bool = False hub_always_push: bool = False gradient_checkpointing: bool = False '
    'gradient_checkpointing_kwargs: Union = None include_inputs_for_metrics: bool = False '
    "eval_do_concat_batches: bool = True fp16_backend: str = 'auto' evaluation_strategy: Union = None "
    'push_to_hub_model_id: Optional = None push_to_hub_organization: Optional = None push_to_hub_token: '
    "Optional = None mp_parameters: str = '' auto_find_batch_size: bool = False full_determinism: bool = "
    "False torchdynamo: Optional = None ray_scope: Optional = 'last' ddp_timeout: Optional = 1800 "
    'torch_compile: bool = False torch_compile_backend: Optional = None torch_compile_mode: Optional = '
    'None dispatch_batches: Optional = None split_batches: Optional = None include_tokens_per_second: '
    'Optional = False include_num_input_tokens_seen: Optional = False neftune_noise_alpha: Optional = '
    'None optim_target_modules: Union = None batch_eval_metrics: bool = False sortish_sampler: bool = '
    'False predict_with_generate: bool = False generation_max_length: Optional = None '
    'generation_num_beams: Optional = None generation_config: Union = None'
)
SEQ2SEQ_ONLY = ("sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
                "generation_config")


def parse_signature(text: str) -> dict[str, tuple[str, str | None]]:
    """``name: Type = default`` pairs of an HF doc signature -> {name: (type word, default text or None)}."""
    pairs = re.findall(r"(\w+): (\w+)(?: = ('[^']*'|<factory>|\S+))?", text)
    return {name: (kind, default or None) for name, kind, default in pairs}


HF = parse_signature(HF_SEQ2SEQ_SIGNATURE)


def field_default(name: str):
    f = {f.name: f for f in fields(FitArguments)}[name]
    return f.default_factory() if f.default is MISSING else f.default


# ---------------------------------------------------------------------------------------------------------------
# The option set mirrors HF


#: a few 4.x defaults, as the HF documentation states them, that anchor the frozen text above
HF4_ANCHORS = {"output_dir": ("str", None), "per_device_train_batch_size": ("int", "8"),
               "learning_rate": ("float", "5e-05"), "adam_beta2": ("float", "0.999"),
               "adam_epsilon": ("float", "1e-08"), "num_train_epochs": ("float", "3.0"), "max_steps": ("int", "-1"),
               "lr_scheduler_type": ("Union", "'linear'"), "logging_steps": ("float", "500"),
               "save_steps": ("float", "500"), "seed": ("int", "42"), "optim": ("Union", "'adamw_torch'"),
               "ddp_timeout": ("Optional", "1800"), "generation_config": ("Union", "None")}


def test_frozen_signature_is_the_hf4_one():
    """F-CORE-4: the frozen signature holds the 130 Seq2SeqTrainingArguments options of transformers 4.x, every
    ``name: Type`` pair parsed, ``output_dir`` first and the five seq2seq-only options last (the 125 before them
    are TrainingArguments'), with the documented defaults above."""
    names = list(HF)
    assert len(names) == 130 and HF_SEQ2SEQ_SIGNATURE.count(": ") == 130
    assert names[0] == "output_dir" and tuple(names[-5:]) == SEQ2SEQ_ONLY
    assert len(set(names) - set(SEQ2SEQ_ONLY)) == 125
    assert {name: HF[name] for name in HF4_ANCHORS} == HF4_ANCHORS


def test_every_hf4_option_is_still_a_field():
    """F-CORE-4: every transformers 4.x TrainingArguments / Seq2SeqTrainingArguments option above is still a
    FitArguments field (transformers 5 removed some; tests/hf_diff/test_arguments_fields.py compares with 5.x)."""
    assert set(HF) - set(FitArguments.field_names()) == set()


#: the 4.x defaults that transformers 5 changed (the HF 5 default is what FitArguments has)
HF5_CHANGED = {"optim": "adamw_torch_fused", "gradient_checkpointing": None, "hub_private_repo": None,
               "include_num_input_tokens_seen": "no", "fsdp": None, "lr_scheduler_kwargs": None}


#: options whose type transformers 5 changed (FitArguments has the 5.x type)
HF5_RETYPED = {"include_num_input_tokens_seen", "warmup_steps"}


@pytest.mark.parametrize("name", sorted(set(HF) - {"output_dir"}))
def test_defaults_equal_hf(name):
    """F-CORE-4: each default equals HF's, literally (``repr`` of the value = the text in the 4.x HF signature),
    except the ones transformers 5 changed, which equal the 5.x default."""
    kind, default = HF[name]
    if name in HF5_CHANGED:
        assert field_default(name) == HF5_CHANGED[name]
    elif default == "<factory>":
        assert field_default(name) == {}
    else:
        assert repr(field_default(name)) == default
    kinds = FitArguments.field_kinds(name)
    if name in HF5_RETYPED:
        return
    if kind == "Optional":
        assert type(None) in kinds
    elif kind in ("bool", "int", "float", "str"):
        assert {"bool": bool, "int": int, "float": float, "str": str}[kind] in kinds


def test_output_dir_default_and_normalised_defaults():
    """F-CORE-4: output_dir defaults to "trainer_output" (HF's); a default instance holds the normalised HF defaults."""
    a = FitArguments()
    assert a.output_dir == "trainer_output"
    assert a.report_to == ["csv"]  # default: the cheap CSV log only ("all" = csv + every installed logger)
    assert a.fsdp == [] and a.debug == [] and a.lr_scheduler_kwargs == {}
    assert (a.accelerator, a.strategy, a.devices, a.num_nodes, a.precision, a.checkpoint_io) == (
        "auto", "auto", "auto", 1, None, "auto")
    assert a.eval_on_start is False and a.eval_steps is None and a.do_eval is False


def test_every_field_has_help_and_group():
    """F-CORE-4: each option has a one-line English help text and a CLI group."""
    for f in fields(FitArguments):
        assert f.metadata["help"] and "\n" not in f.metadata["help"], f.name
        assert field_group(f) in GROUP_NAMES, f.name


# ---------------------------------------------------------------------------------------------------------------
# Serialisation


def busy_args() -> FitArguments:
    return FitArguments(
        output_dir="out", learning_rate=3e-4, max_steps=100, eval_strategy="steps", eval_steps=0.25,
        logging_steps=10, save_strategy="steps", save_steps=20, lr_scheduler_type="cosine",
        lr_scheduler_kwargs={"num_cycles": 0.5}, label_names=["labels", "mask"], report_to="none", bf16=True,
        devices=[0, 1], hub_token="secret", data_seed=7, warmup_ratio=0.1, adam_epsilon=1e-8, optim_args="a=1,b=x")


def test_yaml_round_trip_is_exact(tmp_path):
    """F-CORE-4: YAML text and files round-trip exactly (credentials kept only with redact=False)."""
    a = busy_args()
    assert FitArguments.from_yaml(a.to_yaml(redact=False)) == a
    assert FitArguments.from_yaml(a.to_yaml()) == a.replace(hub_token="<HUB_TOKEN>")
    for name in ("args.yaml", "args.yml"):
        path = a.save(tmp_path / name, redact=False)
        assert path.read_text().startswith("output_dir: out\n")
        assert FitArguments.load(path) == a
        assert FitArguments.from_yaml(str(path)) == a


def test_json_round_trip_is_exact(tmp_path):
    """F-CORE-4: JSON text and files round-trip exactly (credentials kept only with redact=False)."""
    a = busy_args()
    assert FitArguments.from_json(a.to_json_string(redact=False)) == a
    assert json.loads(a.to_json_string())["learning_rate"] == 3e-4
    assert FitArguments.load(a.save(tmp_path / "args.json", redact=False)) == a
    assert FitArguments.from_json(tmp_path / "args.json") == a


def test_to_dict_and_redaction():
    """F-CORE-4: to_dict is complete and a deep copy; redact=True hides tokens as HF's to_dict does."""
    a = busy_args()
    d = a.to_dict()
    assert list(d) == FitArguments.field_names()
    assert d["hub_token"] == "secret" and d["optim_args"] == {"a": 1, "b": "x"}
    d["label_names"].append("x")
    assert a.label_names == ["labels", "mask"]
    assert a.to_dict(redact=True)["hub_token"] == "<HUB_TOKEN>"
    assert "secret" not in a.to_yaml(redact=True) and "secret" not in repr(a)
    assert repr(FitArguments(max_steps=3)) == "FitArguments(max_steps=3)"


def test_to_sanitized_dict_holds_scalars_only():
    """F-CORE-4: to_sanitized_dict (for logger hparams) has only bool/int/float/str values, tokens redacted."""
    s = busy_args().to_sanitized_dict()
    assert all(type(v) in (bool, int, float, str) for v in s.values())
    assert s["learning_rate"] == 3e-4 and s["bf16"] is True
    assert s["label_names"] == "['labels', 'mask']" and s["run_name"] == "None"
    assert s["hub_token"] == "<HUB_TOKEN>"


def test_yaml_strings_are_coerced():
    """F-CORE-4: YAML 1.1 reads ``5e-5`` as a string; numeric and bool options convert such text."""
    a = FitArguments.from_yaml("learning_rate: 5e-5\nmax_steps: '7'\nbf16: 'true'\nnum_train_epochs: 2\n")
    assert a.learning_rate == 5e-5 and a.max_steps == 7 and a.bf16 is True and a.num_train_epochs == 2


def test_unknown_keys_say_did_you_mean(tmp_path):
    """F-CORE-4: unknown keys (dict, kwargs, replace, file) raise ValueError with "Did you mean"."""
    with pytest.raises(ValueError, match=r"Unknown FitArguments option 'lerning_rate'\. Did you mean \"learning_rate\""):
        FitArguments.from_dict({"lerning_rate": 1.0})
    with pytest.raises(ValueError, match="Did you mean \"max_steps\""):
        FitArguments.from_kwargs(max_step=3)
    with pytest.raises(ValueError, match="Did you mean \"warmup_ratio\""):
        FitArguments().replace(warmup_ration=0.1)
    path = tmp_path / "run.yaml"
    path.write_text("per_device_train_batchsize: 4\n")
    with pytest.raises(ValueError, match="Did you mean \"per_device_train_batch_size\""):
        FitArguments.load(path)


def test_file_errors(tmp_path):
    """F-CORE-4: missing files, non-mapping content and unknown extensions are clear errors."""
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        FitArguments.from_yaml(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="must be a mapping"):
        FitArguments.from_yaml("- a\n- b\n")
    with pytest.raises(ValueError, match="Cannot parse json"):
        FitArguments.from_json("{not json")
    with pytest.raises(ValueError, match=r"Unknown config file extension '\.toml'"):
        FitArguments().save(tmp_path / "args.toml")
    assert FitArguments.from_yaml("") == FitArguments()


def test_replace_validates_and_does_not_share_state():
    """F-CORE-4: replace returns a validated copy; lists are not shared with the original."""
    a = FitArguments(label_names=["labels"])
    b = a.replace(max_steps=5)
    assert (a.max_steps, b.max_steps) == (-1, 5)
    b.label_names.append("other")
    assert a.label_names == ["labels"]
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be >= 1"):
        a.replace(gradient_accumulation_steps=0)


# ---------------------------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("kwargs, message", [
    ({"eval_strategy": "step"}, r"Unknown eval_strategy 'step'\. Did you mean \"steps\"\? Valid choices: epoch, no, steps\."),
    ({"evaluation_strategy": "epoc"}, r"Unknown eval_strategy 'epoc'\. Did you mean \"epoch\""),
    ({"logging_strategy": "always"}, r"Unknown logging_strategy 'always'.*Valid choices: epoch, no, steps"),
    ({"save_strategy": "bset"}, r"Unknown save_strategy 'bset'\. Did you mean \"best\".*epoch, no, steps"),
    ({"hub_strategy": "every-save"}, r"Unknown hub_strategy 'every-save'\. Did you mean \"every_save\""),
    ({"precision": "bf16-mix"}, r"Unknown precision 'bf16-mix'.*Did you mean .bf16-mixed.*Valid choices: 16-mixed, 16-true, 32-true, 64-true, bf16-mixed"),
    ({"log_level": "verbose"}, r"Unknown log_level 'verbose'.*critical, debug, error, info, passive, warning"),
    ({"log_level_replica": "warn"}, r"Unknown log_level_replica 'warn'\. Did you mean \"warning\""),
    ({"lr_scheduler_type": "cosine_restarts"}, r"Unknown lr_scheduler_type 'cosine_restarts'\. Did you mean \"cosine_with_restarts\""),
    ({"optim": "adamw"}, r"Unknown optim 'adamw'\. Did you mean"),
    ({"report_to": "tensorbord"}, r"Unknown report_to logger 'tensorbord'\. Did you mean \"tensorboard\""),
    ({"report_to": ["none", "csv"]}, "mixes 'none' with loggers"),
    ({"fsdp": "full_shard autowrap"}, r"Unknown fsdp option 'autowrap'\. Did you mean \"auto_wrap\""),
    ({"fsdp": "offload"}, "cannot work on its own"),
    ({"fsdp": "full_shard shard_grad_op"}, "both 'full_shard' and 'shard_grad_op'"),
    ({"debug": "underflow"}, r"Unknown debug option 'underflow'"),
    ({"ddp_backend": "ncl"}, r"Unknown ddp_backend 'ncl'\. Did you mean \"nccl\""),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1 .*got 0"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be >= 1 .*got 0"),
    ({"per_device_eval_batch_size": -2}, "per_device_eval_batch_size must be >= 1 .*got -2"),
    ({"learning_rate": -1e-3}, "learning_rate must be >= 0, got -0.001"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio must be in \[0, 1\] .*got 1.5"),
    ({"max_grad_norm": -1.0}, "max_grad_norm must be >= 0 .*got -1.0"),
    ({"adam_beta2": 1.0}, r"adam_beta2 must be in \[0, 1\), got 1.0"),
    ({"logging_steps": 0}, "logging_strategy='steps' needs logging_steps > 0"),
    ({"save_steps": -5}, "save_strategy='steps' needs save_steps > 0"),
    ({"eval_strategy": "steps", "eval_steps": 0}, "eval_strategy='steps' needs eval_steps > 0"),
    ({"logging_steps": 12.5}, "logging_steps must be an integer .*got 12.5"),
    ({"num_train_epochs": 0}, "num_train_epochs must be > 0 when max_steps <= 0"),
    ({"dataloader_num_workers": -1}, "dataloader_num_workers must be >= 0"),
    ({"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor can only be set when dataloader_num_workers > 0"),
    ({"dataloader_persistent_workers": True}, "dataloader_persistent_workers=True needs dataloader_num_workers > 0"),
    ({"fp16": True, "bf16": True}, "at most one of fp16 and bf16"),
    ({"fp16_full_eval": True, "bf16_full_eval": True}, "at most one can be True"),
    ({"precision": "bf16-true", "bf16": True}, r"precision='bf16-true' contradicts bf16=True"),
    ({"precision": "32-true", "fp16": True}, r"precision='32-true' contradicts fp16=True"),
    ({"use_cpu": True, "accelerator": "cuda"}, "use_cpu=True contradicts accelerator='cuda'"),
    ({"load_best_model_at_end": True}, "requires the save and eval strategy to match.*'no'.*'steps'"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 300, "save_steps": 500},
     "save_steps to be a round multiple of eval_steps"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.1, "save_steps": 500},
     "mixing a ratio and absolute steps"),
    ({"save_strategy": "best"}, "save_strategy='best' needs evaluation"),
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "reduce_lr_on_plateau' needs evaluation"),
    ({"evaluation_strategy": "steps", "eval_strategy": "epoch"}, "evaluation_strategy='steps' .*conflicts with eval_strategy='epoch'"),
    ({"per_gpu_train_batch_size": 4, "per_device_train_batch_size": 16}, "conflicts with per_device_train_batch_size=16"),
    ({"adafactor": True, "optim": "sgd"}, "adafactor=True .*conflicts with optim='sgd'"),
    ({"learning_rate": "fast"}, r"FitArguments.learning_rate must be float, got 'fast' \(str\)"),
    ({"max_steps": 2.5}, r"FitArguments.max_steps must be int, got 2.5"),
    ({"bf16": "maybe"}, r"FitArguments.bf16 must be bool, got 'maybe'"),
    ({"per_device_train_batch_size": True}, "per_device_train_batch_size must be int, got True"),
    ({"output_dir": 3}, "output_dir must be str | None, got 3"),
    ({"lr_scheduler_kwargs": "[1, 2]"}, "lr_scheduler_kwargs must be a dict or a JSON object string"),
    ({"optim_args": "lr"}, "optim_args must be a dict, a JSON object or 'key=value,key2=value2'"),
    ({"devices": 0}, "devices=0 is invalid"),
    ({"devices": "gpu"}, "devices='gpu' is invalid"),
    ({"devices": [0, 0]}, r"devices=\[0, 0\] is invalid"),
    ({"num_nodes": 0}, "num_nodes must be >= 1, got 0"),
    ({"label_smoothing_factor": 1.0}, r"label_smoothing_factor must be in \[0, 1\)"),
    ({"save_total_limit": -1}, "save_total_limit must be >= 0 or None, got -1"),
])
def test_validation_errors_name_value_and_choices(kwargs, message):
    """F-CORE-4: every bad value fails at construction with a ValueError naming it (and the choices)."""
    with pytest.raises(ValueError, match=message):
        FitArguments(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"fp16_opt_level": "O2"}, "fp16_opt_level='O2' is not supported: .*apex is not supported, use native AMP"),
    ({"half_precision_backend": "apex"}, "half_precision_backend='apex' is not supported: apex is not supported"),
    ({"fp16_backend": "apex"}, "half_precision_backend='apex' is not supported"),
    ({"use_ipex": True}, "use_ipex=True is not supported"),
    ({"jit_mode_eval": True}, "jit_mode_eval=True is not supported"),
    ({"use_legacy_prediction_loop": True}, "use_legacy_prediction_loop=True is not supported"),
    ({"past_index": 2}, "past_index=2 is not supported"),
    ({"mp_parameters": "--partitions 2"}, "mp_parameters='--partitions 2' is not supported: SageMaker"),
])
def test_never_supported_options_raise_value_error(kwargs, message):
    """F-CORE-4: options taskfit never supports raise ValueError (not NotImplementedError) with the reason."""
    with pytest.raises(ValueError, match=message):
        FitArguments(**kwargs)


def test_ray_scope_is_accepted():
    """F-CORE-4: ray_scope is stored for the later HPO feature without error."""
    assert FitArguments(ray_scope="all").ray_scope == "all"


def test_deprecated_aliases_are_copied_and_reset():
    """F-CORE-4: evaluation_strategy, per_gpu_*, no_cuda, fp16_backend, torchdynamo, adafactor (HF aliases)."""
    a = FitArguments(evaluation_strategy="epoch", per_gpu_train_batch_size=4, per_gpu_eval_batch_size=2,
                     no_cuda=True, fp16_backend="cpu_amp")
    assert (a.eval_strategy, a.evaluation_strategy, a.do_eval) == ("epoch", None, True)
    assert (a.per_device_train_batch_size, a.per_gpu_train_batch_size) == (4, None)
    assert (a.per_device_eval_batch_size, a.per_gpu_eval_batch_size) == (2, None)
    assert (a.use_cpu, a.no_cuda) == (True, False)
    assert (a.half_precision_backend, a.fp16_backend) == ("cpu_amp", "auto")
    assert FitArguments(evaluation_strategy="steps", eval_strategy="steps").eval_strategy == "steps"
    b = FitArguments(torchdynamo="eager")
    assert (b.torch_compile_backend, b.torchdynamo, b.torch_compile) == ("eager", None, True)
    assert FitArguments(torch_compile_mode="max-autotune").torch_compile is True
    assert FitArguments(adafactor=True).optim == "adafactor"
    assert a.replace(eval_strategy="no").eval_strategy == "no"  # the alias does not come back


def test_hf_derived_defaults():
    """F-CORE-4: eval_steps falls back to logging_steps; metric_for_best_model/greater_is_better follow HF."""
    a = FitArguments(eval_strategy="steps", logging_steps=50)
    assert (a.eval_steps, a.do_eval) == (50, True)
    assert FitArguments(eval_strategy="epoch").eval_steps is None
    assert FitArguments(metric_for_best_model="accuracy").greater_is_better is True
    assert FitArguments(metric_for_best_model="eval_loss").greater_is_better is False
    assert FitArguments(metric_for_best_model="accuracy", greater_is_better=False).greater_is_better is False
    b = FitArguments(load_best_model_at_end=True, eval_strategy="steps", eval_steps=100, save_steps=500)
    assert (b.metric_for_best_model, b.greater_is_better) == ("loss", False)
    c = FitArguments(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.2)
    assert (c.eval_steps, c.save_steps) == (0.1, 0.2)
    with pytest.raises(ValueError, match="metric_for_best_model. must be provided"):  # as HF's Trainer
        FitArguments(save_strategy="best", eval_strategy="epoch")
    assert FitArguments(logging_steps=20.0).logging_steps == 20 and isinstance(FitArguments(logging_steps=20.0).logging_steps, int)


def test_dict_options_accept_json_strings():
    """F-CORE-4: lr_scheduler_kwargs, fsdp_config, deepspeed, gradient_checkpointing_kwargs, optim_args decode JSON."""
    a = FitArguments(lr_scheduler_kwargs='{"num_cycles": 2}', fsdp_config='{"min_num_params": 1000}',
                     deepspeed='{"zero_optimization": {"stage": 2}}', gradient_checkpointing_kwargs='{"use_reentrant": false}',
                     optim_args='{"betas": [0.9, 0.95]}', accelerator_config="accel.json")
    assert a.lr_scheduler_kwargs == {"num_cycles": 2}
    assert a.fsdp_config == {"min_num_params": 1000}
    assert a.deepspeed == {"zero_optimization": {"stage": 2}}
    assert a.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert a.optim_args == {"betas": [0.9, 0.95]}
    assert a.accelerator_config == "accel.json"  # a path stays a path
    assert FitArguments(deepspeed="ds_config.json").deepspeed == "ds_config.json"
    assert FitArguments(optim_args="foo=1,bar=x, baz=true").optim_args == {"foo": 1, "bar": "x", "baz": True}
    assert FitArguments(lr_scheduler_kwargs=None).lr_scheduler_kwargs == {}


def test_list_options_are_normalised():
    """F-CORE-4: report_to and fsdp/debug become lists; "all" expands to csv + the installed loggers, None to csv."""
    assert FitArguments(report_to="none").report_to == []
    assert FitArguments(report_to=["none"]).report_to == []
    assert FitArguments(report_to="all").report_to == list(installed_loggers())
    assert FitArguments(report_to="csv").report_to == ["csv"]
    assert FitArguments(report_to="csv,tensorboard").report_to == ["csv", "tensorboard"]
    assert FitArguments(report_to='["wandb", "all", "csv"]').report_to == list(dict.fromkeys(["wandb", *installed_loggers()]))
    assert FitArguments(fsdp="full_shard auto_wrap").fsdp == ["full_shard", "auto_wrap"]
    assert FitArguments(fsdp=True).fsdp == ["full_shard"] and FitArguments(fsdp=False).fsdp == []
    assert FitArguments(debug="underflow_overflow").debug == ["underflow_overflow"]
    assert FitArguments(label_names="labels").label_names == ["labels"]


@pytest.mark.parametrize("given, expected", [
    ("auto", "auto"), (2, 2), (-1, -1), ("2", 2), ("-1", -1), ("0,1", [0, 1]), ("[1, 3]", [1, 3]), ([0, 2], [0, 2]),
    (["0", "1"], [0, 1]),
])
def test_devices_forms(given, expected):
    """F-CORE-4 / F-ACC-2: devices accepts a count, -1, 'auto', a list of indices or their text forms."""
    assert FitArguments(devices=given).devices == expected


def test_validate_after_direct_assignment():
    """F-CORE-4: attribute assignment is unchecked until validate(), which re-runs the checks."""
    a = FitArguments()
    a.eval_strategy = "hourly"
    with pytest.raises(ValueError, match="Unknown eval_strategy 'hourly'"):
        a.validate()


# ---------------------------------------------------------------------------------------------------------------
# Derived values


@pytest.mark.parametrize("kwargs, expected", [
    ({}, "32-true"), ({"bf16": True}, "bf16-mixed"), ({"fp16": True}, "16-mixed"),
    ({"precision": "bf16-true"}, "bf16-true"), ({"precision": "64-true"}, "64-true"),
    ({"bf16": True, "precision": "bf16-mixed"}, "bf16-mixed"), ({"fp16": True, "precision": "16-mixed"}, "16-mixed"),
])
def test_resolved_precision(kwargs, expected):
    """F-CORE-4 / F-PREC-1: fp16/bf16 flags and precision names resolve to one precision plugin name."""
    assert FitArguments(**kwargs).resolved_precision() == expected


def test_resolved_paths_and_steps():
    """F-CORE-4: logging_dir/run_name fall back to output_dir; ratio intervals and warmup resolve to steps."""
    a = FitArguments(output_dir="runs/x/", logging_steps=0.1, save_steps=40, warmup_ratio=0.25)
    assert a.logging_dir is None and a.resolved_logging_dir == "runs/x/logs"
    assert a.resolved_run_name == "runs/x/"
    assert FitArguments(logging_dir="tb").resolved_logging_dir == "tb"
    assert a.interval_steps("logging", 95) == 10
    assert a.interval_steps("save", 95) == 40
    assert a.interval_steps("eval", 95) == 10  # eval_steps None -> logging_steps
    assert a.get_warmup_steps(10) == 3
    assert a.replace(warmup_steps=5).get_warmup_steps(10) == 5
    with pytest.raises(ValueError, match="Unknown interval kind 'saving'"):
        a.interval_steps("saving", 10)
