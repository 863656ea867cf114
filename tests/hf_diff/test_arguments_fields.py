"""F-CORE-4: `FitArguments` against the installed ``transformers.TrainingArguments`` / ``Seq2SeqTrainingArguments``
(the peer is the oracle): every HF field name exists with HF's default, except the documented differences below,
which docs/hf.md ("Argument differences") lists too; the 4.x spellings transformers 5 removed are accepted with a
FutureWarning naming the new option; the properties and methods scripts call give HF's values."""

import dataclasses
import logging
import re
import warnings
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from taskfit.arguments.fit_arguments import FitArguments  # noqa: E402
from taskfit.arguments.legacy import LegacyFields  # noqa: E402
from taskfit.arguments.taskfit_fields import TaskfitFields  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "hf.md"

#: HF field -> (HF default, taskfit default): defaults that differ on purpose (docs/hf.md "Argument differences").
DIFFERENT_DEFAULTS = {
    "report_to": ("none", None),  # None = a local CSV log (HF 5: no logger)
}
#: HF fields taskfit accepts but refuses when set, or ignores with a warning (each named in the docs table).
REFUSED_WHEN_SET = {"use_liger_kernel": True, "liger_kernel_config": {},
                    "train_sampling_strategy": "batch_rebalance"}
WARNED_WHEN_SET = {"dataloader_in_order": False, "trackio_space_id": "me/space",
                   "trackio_bucket_id": "b", "trackio_static_space_id": "me/static"}
#: transformers 4.x names (removed in 5) -> (value, the HF 5 option it sets, the value there)
RENAMED_4X = {
    "evaluation_strategy": ("epoch", "eval_strategy", "epoch"),
    "per_gpu_train_batch_size": (4, "per_device_train_batch_size", 4),
    "per_gpu_eval_batch_size": (2, "per_device_eval_batch_size", 2),
    "no_cuda": (True, "use_cpu", True),
    "include_inputs_for_metrics": (True, "include_for_metrics", ["inputs"]),
    "group_by_length": (True, "train_sampling_strategy", "group_by_length"),
    "warmup_ratio": (0.1, "warmup_steps", 0.1),
    "adafactor": (True, "optim", "adafactor"),
    "torchdynamo": ("eager", "torch_compile_backend", "eager"),
    "push_to_hub_model_id": ("me/m", "hub_model_id", "me/m"),
    "tpu_metrics_debug": (True, "debug", ["tpu_metrics_debug"]),
    "gradient_checkpointing": (True, "activation_checkpointing", True),
}


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _fields(cls) -> dict:
    return {f.name: _default(f) for f in dataclasses.fields(cls)}


def _value(v):
    return getattr(v, "value", v)


def test_every_hf5_field_exists_with_hf_default():
    """Every TrainingArguments field of the installed transformers is a FitArguments field with the same default,
    except the documented differences."""
    hf, ours = _fields(transformers.TrainingArguments), _fields(FitArguments)
    assert sorted(set(hf) - set(ours)) == []
    differing = {n: (_value(hf[n]), ours[n]) for n in hf if _value(hf[n]) != ours[n]}
    assert differing == DIFFERENT_DEFAULTS


def test_seq2seq_fields():
    """Seq2SeqTrainingArguments' own fields are fields of every FitArguments (taskfit.hf's
    Seq2SeqTrainingArguments is FitArguments) with HF's defaults."""
    hf = _fields(transformers.Seq2SeqTrainingArguments)
    own = {n: v for n, v in hf.items() if n not in _fields(transformers.TrainingArguments)}
    assert own == {"sortish_sampler": False, "predict_with_generate": False, "generation_max_length": None,
                   "generation_num_beams": None, "generation_config": None}
    ours = _fields(FitArguments)
    assert {n: ours[n] for n in own} == own
    from taskfit.hf import Seq2SeqTrainingArguments, TrainingArguments

    assert issubclass(Seq2SeqTrainingArguments, FitArguments) and issubclass(TrainingArguments, FitArguments)


def test_taskfit_only_fields_are_the_listed_ones():
    """Every FitArguments field HF 5 lacks is a 4.x spelling, a seq2seq field, or a taskfit option; all are in
    the docs table."""
    hf = set(_fields(transformers.Seq2SeqTrainingArguments))
    extra = set(_fields(FitArguments)) - hf
    legacy, own = set(LegacyFields.__dataclass_fields__), set(TaskfitFields.__dataclass_fields__)
    assert extra == legacy | own and not legacy & own
    table = _docs_table()
    missing = sorted(n for n in extra | set(DIFFERENT_DEFAULTS) | set(REFUSED_WHEN_SET) | set(WARNED_WHEN_SET)
                     if f"`{n}`" not in table)
    assert missing == []


def _docs_table() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## Argument differences")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else None]


def test_hf5_defaults_after_construction():
    """A default FitArguments holds what a default TrainingArguments holds after its __post_init__ (lists, enums'
    values), except the documented differences (output_dir, report_to)."""
    hf = transformers.TrainingArguments()
    ours = FitArguments()
    skip = {"output_dir", "report_to", "accelerator_config", "fsdp", "fsdp_config", "lr_scheduler_kwargs",
            "disable_tqdm", "logging_dir"}
    mismatched = {}
    for f in dataclasses.fields(transformers.TrainingArguments):
        if f.name in skip:
            continue
        theirs, mine = getattr(hf, f.name), getattr(ours, f.name)
        theirs = [_value(v) for v in theirs] if isinstance(theirs, list) else _value(theirs)
        if theirs != mine:
            mismatched[f.name] = (theirs, mine)
    assert mismatched == {}
    assert (hf.output_dir, ours.output_dir) == ("trainer_output", "trainer_output")
    assert (hf.report_to, ours.report_to) == ([], ["csv"])
    assert (hf.fsdp, ours.fsdp, ours.lr_scheduler_kwargs) == (None, [], {})  # taskfit normalises to a list


@pytest.mark.parametrize("old", sorted(RENAMED_4X))
def test_4x_spelling_warns_and_maps(old):
    """A transformers 4.x option emits a FutureWarning naming its HF 5 replacement and sets it."""
    value, new, expected = RENAMED_4X[old]
    with pytest.warns(FutureWarning, match=re.escape(new)):
        a = FitArguments(**{old: value})
    assert getattr(a, new) == expected
    again = FitArguments.from_dict(a.to_dict())  # a round trip warns nothing
    assert getattr(again, new) == expected


def test_4x_no_effect_options_warn():
    for name, value in (("overwrite_output_dir", True), ("tpu_num_cores", 8), ("ray_scope", "all")):
        with pytest.warns(FutureWarning, match=f"{name}=.* has no effect"):
            FitArguments(**{name: value})


@pytest.mark.parametrize("name", sorted(REFUSED_WHEN_SET))
def test_unsupported_hf5_options_raise_naming_the_option(name):
    with pytest.raises(ValueError, match=re.escape(name)):
        FitArguments(**{name: REFUSED_WHEN_SET[name]})
    FitArguments(**{name: _fields(transformers.TrainingArguments)[name]})  # the default is fine


def test_refused_objects_and_revision():
    with pytest.raises(ValueError, match="parallelism_config"):
        FitArguments(parallelism_config=object())
    with pytest.raises(ValueError, match="hub_revision"):
        FitArguments(push_to_hub=True, hub_model_id="memory://x", hub_revision="dev")
    assert FitArguments(hub_revision="dev").hub_revision == "dev"  # stored while nothing is pushed


@pytest.mark.parametrize("name", sorted(WARNED_WHEN_SET))
def test_ignored_hf5_options_warn_naming_the_option(name):
    with pytest.warns(UserWarning, match=f"{name}=.* has no effect"):
        FitArguments(**{name: WARNED_WHEN_SET[name]})


def test_hf5_value_forms():
    """HF 5 value forms: include_num_input_tokens_seen bool -> 'all'/'no', float warmup_steps < 1 is a ratio,
    include_for_metrics checked, torch_empty_cache_steps > 0."""
    assert FitArguments(include_num_input_tokens_seen=True).include_num_input_tokens_seen == "all"
    assert FitArguments(warmup_steps=0.25).get_warmup_steps(10) == transformers.TrainingArguments(
        warmup_steps=0.25).get_warmup_steps(10) == 3
    assert FitArguments(include_for_metrics=["inputs", "loss"]).include_inputs_for_metrics is True
    with pytest.raises(ValueError, match="include_for_metrics item 'labels'"):
        FitArguments(include_for_metrics=["labels"])
    with pytest.raises(ValueError, match="torch_empty_cache_steps"):
        FitArguments(torch_empty_cache_steps=0)


# ---------------------------------------------------------------------------------------------------------------
# properties and methods scripts call, against transformers' object built with the same arguments
PROPS = ("world_size", "process_index", "local_process_index", "should_log", "should_save", "train_batch_size",
         "eval_batch_size", "n_gpu")


def _pairs():
    kw = dict(per_device_train_batch_size=4, per_device_eval_batch_size=3, log_level="info",
              log_level_replica="error", use_cpu=True, warmup_steps=0.1, report_to="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.TrainingArguments(output_dir="o", **kw), FitArguments(output_dir="o", **kw)


def test_process_properties_single_process():
    hf, ours = _pairs()
    assert {p: getattr(ours, p) for p in PROPS} == {p: getattr(hf, p) for p in PROPS}
    assert ours.device == hf.device and str(ours.device) == "cpu"
    assert ours.parallel_mode.value == hf.parallel_mode.value == "not_parallel"
    assert ours.get_process_log_level() == hf.get_process_log_level() == logging.INFO
    assert ours.get_warmup_steps(95) == hf.get_warmup_steps(95) == 10
    assert ours.ddp_timeout_delta == hf.ddp_timeout_delta
    with ours.main_process_first(desc="tokenize"), hf.main_process_first(desc="tokenize"):
        pass
    mine, theirs = ours.to_sanitized_dict(), hf.to_sanitized_dict()
    assert {k: mine[k] for k in ("train_batch_size", "eval_batch_size", "learning_rate", "optim", "seed")} == \
        {k: theirs[k] for k in ("train_batch_size", "eval_batch_size", "learning_rate", "optim", "seed")}
    d = ours.to_dict()
    assert set(_fields(transformers.TrainingArguments)) <= set(d)
    assert FitArguments.from_json(ours.to_json_string()) == ours


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_process_properties_under_two_process_ddp(tmp_path):
    """Under torchrun with 2 gloo processes, every property equals transformers' on each rank, and
    main_process_first lets rank 0 through first under both."""
    import json
    import os
    import subprocess
    import sys

    from taskfit.strategies.environments import find_free_port

    job = Path(__file__).with_name("arguments_ddp_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={find_free_port()}",
           str(job), str(tmp_path)]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, row in enumerate(rows):
        hf, tf = dict(row["hf"]), dict(row["tf"])
        hf_entered, tf_entered = hf.pop("entered"), tf.pop("entered")
        assert tf == hf
        assert (tf["world_size"], tf["process_index"], tf["should_save"]) == (2, rank, rank == 0)
        assert tf["parallel_mode"] == "distributed" and tf["log_level"] == (logging.INFO if rank == 0 else
                                                                            logging.ERROR)
    assert rows[1]["tf"]["entered"] >= rows[0]["tf"]["entered"] + 0.4  # rank 1 waited for rank 0's block
    assert rows[1]["hf"]["entered"] >= rows[0]["hf"]["entered"] + 0.4


def test_hf_argument_parser_reads_fit_arguments():
    """transformers.HfArgumentParser parses FitArguments as it parses TrainingArguments (the same command line
    gives the same values), and parsing leaves FitArguments' own type checks intact."""
    cli = ["--output_dir", "x", "--optim", "adafactor", "--include_for_metrics", "inputs", "--warmup_steps", "0.1",
           "--eval_strategy", "steps", "--eval_steps", "3", "--gradient_checkpointing", "true", "--report_to", "none",
           "--per_device_train_batch_size", "4", "--lr_scheduler_kwargs", '{"num_cycles": 2}']
    (hf,) = transformers.HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(cli)
    (ours,) = transformers.HfArgumentParser(FitArguments).parse_args_into_dataclasses(cli)
    for name in ("optim", "include_for_metrics", "warmup_steps", "eval_strategy", "eval_steps",
                 "activation_checkpointing", "report_to", "per_device_train_batch_size", "lr_scheduler_kwargs"):
        assert getattr(ours, name) == _value(getattr(hf, name)), name
    assert FitArguments(devices=[0, 1], fsdp=True, fast_dev_run=3).devices == [0, 1]


def test_hf5_data_and_ddp_options_are_applied():
    """train_sampling_strategy='sequential' trains in dataset order (HF: SequentialSampler),
    dataloader_multiprocessing_context reaches the DataLoader, ddp_static_graph reaches DDP's keywords."""
    import torch

    from taskfit.data.loaders import build_dataloader
    from taskfit.strategies.ddp import DDPStrategy

    data = [{"x": torch.tensor(float(i))} for i in range(6)]
    seq = build_dataloader(data, FitArguments(train_sampling_strategy="sequential"), train=True, batch_size=2)
    assert [b["x"].tolist() for b in seq] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert isinstance(seq.sampler, torch.utils.data.SequentialSampler)
    ctx = build_dataloader(data, FitArguments(dataloader_num_workers=1, dataloader_multiprocessing_context="spawn"),
                           train=True, batch_size=2)
    assert ctx.multiprocessing_context.get_start_method() == "spawn"
    from taskfit.connector import strategy_settings

    strategy = DDPStrategy.__new__(DDPStrategy)
    strategy.static_graph, strategy.root_device = False, torch.device("cpu")
    strategy.settings = strategy_settings(DDPStrategy, FitArguments(ddp_static_graph=True))
    assert strategy.ddp_kwargs()["static_graph"] is True


def test_taskfit_hf_argument_parser_is_transformers_and_parses_lightning_switches_F_CORE_4(tmp_path):
    """F-CORE-4: ``taskfit.hf.HfArgumentParser`` is transformers' class; over taskfit's ``TrainingArguments`` it
    parses Lightning's two-type switches as the ``taskfit`` command line does (a count stays an int, a fraction a
    float, ``--fast_dev_run`` alone is True), in every form a script uses (command line, dict, JSON file), and
    ``--help`` lists them."""
    import json

    import taskfit.hf

    assert taskfit.hf.HfArgumentParser is transformers.HfArgumentParser
    parser = transformers.HfArgumentParser(taskfit.hf.TrainingArguments)
    cases = {("--fast_dev_run", "5"): {"fast_dev_run": 5}, ("--fast_dev_run",): {"fast_dev_run": True},
             ("--fast_dev_run", "false"): {"fast_dev_run": False},
             ("--limit_train_batches", "10", "--limit_val_batches", "0.25", "--overfit_batches", "1"):
                 {"limit_train_batches": 10, "limit_val_batches": 0.25, "overfit_batches": 1},
             ("--limit-test-batches", "1.0", "--devices", "2"): {"limit_test_batches": 1.0, "devices": 2}}
    for cli, expected in cases.items():
        (a,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--report_to", "none", *cli])
        got = {k: getattr(a, k) for k in expected}
        assert got == expected and {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in
                                                                             expected.items()}, cli
    with pytest.raises(SystemExit):  # argparse's error for a value that is neither a flag nor a count
        parser.parse_args_into_dataclasses(["--fast_dev_run", "many"])
    values = {"output_dir": str(tmp_path), "fast_dev_run": 3, "limit_train_batches": 0.5, "learning_rate": 0.01}
    (a,) = parser.parse_dict(values)
    (path := tmp_path / "args.json").write_text(json.dumps(values))
    (b,) = parser.parse_json_file(str(path))
    for x in (a, b):
        assert (x.fast_dev_run, x.limit_train_batches, x.learning_rate) == (3, 0.5, 0.01)
    text = parser.format_help()
    assert "--fast_dev_run [FAST_DEV_RUN]" in text and "--limit_train_batches" in text and "--optim" in text


def test_hf_fields_parse_as_transformers_parses_them_F_CORE_4():
    """F-CORE-4: for every field of transformers' ``TrainingArguments``, ``HfArgumentParser`` builds the same
    option over taskfit's class as over transformers' own (spellings, nargs, const, default, whether choices are
    checked while parsing), except the documented default difference; a choice option accepts what FitArguments
    accepts: the values that differ from HF's lists are listed below."""
    hf = {a.dest: a for a in transformers.HfArgumentParser(transformers.TrainingArguments)._actions}
    ours = {a.dest: a for a in transformers.HfArgumentParser(FitArguments)._actions}
    differing, choices = {}, {}
    for f in dataclasses.fields(transformers.TrainingArguments):
        x, y = hf[f.name], ours[f.name]
        a = (sorted(x.option_strings), x.nargs, x.const, _value(x.default), x.choices is None)
        b = (sorted(y.option_strings), y.nargs, y.const, y.default, y.choices is None)
        if a != b:
            differing[f.name] = (a, b)
        if y.choices is not None:
            theirs = {_value(c) for c in x.choices}
            choices[f.name] = (sorted(set(y.choices) - theirs), sorted(theirs - set(y.choices)))
    assert {k: (a[3], b[3]) for k, (a, b) in differing.items()} == {"report_to": ("none", None)}  # DIFFERENT_DEFAULTS
    # (taskfit-only values, HF-only values) of the choice options: taskfit's extra optimizer names and its ccl
    # backend; HF's "detail" log level and cncl / mccl backends, which FitArguments refuses
    assert {k: v for k, v in choices.items() if v != ([], [])} == {
        "optim": (["adamw_apex_fused", "adamw_hf", "lion"], []),
        "log_level": ([], ["detail"]), "log_level_replica": ([], ["detail"]), "ddp_backend": (["ccl"], ["cncl", "mccl"])}
    with pytest.raises(SystemExit):  # a bad choice: argparse's error, as under HF
        transformers.HfArgumentParser(FitArguments).parse_args_into_dataclasses(["--eval_strategy", "often"])
