"""The ``taskfit`` command line (F-CORE-6).

::

    taskfit fit --config run.yaml --strategy ddp --devices 2 --max_steps 100
    taskfit validate|test|predict --config run.yaml --ckpt_path last   (or best, or a checkpoint path)
    python -m taskfit.cli.app fit --config run.yaml
    taskfit bench overhead --quick --check    (benchmark suites, from a source checkout: benchmarks/README.md)

``--config`` names a YAML or JSON file whose top-level keys are :class:`~taskfit.arguments.fit_arguments.FitArguments`
options plus these non-option keys:

- ``module``: import path ``"pkg.mod:ClassOrFactory"`` (or ``"pkg.mod.ClassOrFactory"``) of the model /
  ``TaskModule``; it is called with ``module_kwargs`` (a dict).
- ``data``: import path of a callable (called with ``data_kwargs``) returning a dict with any of ``train``,
  ``eval``, ``test``, ``predict`` (datasets or DataLoaders) and optionally ``data_collator``;
- or ``datamodule``: import path of a DataModule class, instantiated with ``datamodule_kwargs``.

Every option is also a flag ``--name value`` (``--name-with-dashes`` is accepted too), generated from the dataclass:
booleans accept ``--flag`` or ``--flag true|false``; list options accept several values or JSON; dict options
accept JSON; ``null`` sets an optional option to None. Precedence: dataclass defaults < config file < flags
(``*_kwargs`` flags are merged key by key into the config's). Unknown flags or config keys exit with status 2
and a "Did you mean". The run prints its metrics as one JSON line, the last line of stdout (global rank 0 only).
Import paths resolve from the config file's folder and the working directory, as ``python -m`` would.

The core (``taskfit.fit.fit.Fit``) is imported only when a command runs, so ``taskfit --help`` stays fast.
"""

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from taskfit.__about__ import __version__
from taskfit.arguments.fit_arguments import FitArguments, read_config
from taskfit.arguments.fields import field_group
from taskfit.registry import did_you_mean

COMMANDS = {
    "fit": "Train (and evaluate during training per eval_strategy).",
    "validate": "Run the evaluation loop on the 'eval' data.",
    "test": "Run the evaluation loop on the 'test' data.",
    "predict": "Run the prediction loop on the 'predict' data (or 'test' when 'predict' is absent).",
    "estimate": "Print the memory estimate (parameters, gradients, optimizer state, activations) and exit.",
}
#: non-option keys a config file (or flag) may carry
CONFIG_KEYS = ("module", "module_kwargs", "data", "data_kwargs", "datamodule", "datamodule_kwargs")
#: keys the ``data`` callable's dict may carry
DATA_KEYS = ("train", "eval", "test", "predict", "data_collator")
_GROUPS = {
    "output": "output", "training": "training", "optimizer": "optimizer", "schedule": "learning-rate schedule",
    "evaluation": "evaluation", "logging": "logging", "checkpoint": "checkpoints", "data": "data loading",
    "precision": "precision and memory", "placement": "placement (accelerator, strategy, devices)",
    "hardware": "hardware", "distributed": "distributed", "hub": "publishing", "generation": "generation (seq2seq)",
    "compat": "deprecated / compatibility",
}


class CLIError(Exception):
    """A usage error found after parsing (bad import path, missing data); ``main`` reports it with status 2."""


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"hidden\": 8}}', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``taskfit`` parser: one sub-parser per command, each with ``--config``, the non-option keys and one flag
    per ``FitArguments`` field (``default=SUPPRESS``, so only given flags reach the namespace)."""
    parser = argparse.ArgumentParser(prog="taskfit", allow_abbrev=False,
                                     description="Train, validate, test or predict with a taskfit module.")
    parser.add_argument("--version", action="version", version=f"taskfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = {}  # type: ignore[attr-defined]
    for command, summary in COMMANDS.items():
        p = sub.add_parser(command, help=summary, description=summary, allow_abbrev=False,
                           usage=f"taskfit {command} [--config PATH] [--module PATH] [--data PATH] [--OPTION VALUE ...]")
        _add_options(p)
        parser.commands[command] = p  # type: ignore[attr-defined]
    sub.add_parser("plot", help="Redraw a run's training curves (PNG) from its metrics.csv: taskfit plot RUN_DIR.")
    sub.add_parser("bench", help="Run a benchmark suite (source checkout): taskfit bench SUITE [--quick] [--check].")
    sub.add_parser("convert", help="Convert a sharded FSDP or DeepSpeed checkpoint to full weights: "
                   "taskfit convert CHECKPOINT OUT.")
    return parser


def _add_options(p: argparse.ArgumentParser) -> None:
    run = p.add_argument_group("run")
    run.add_argument("--config", metavar="PATH", help="YAML or JSON file of options and the keys below.")
    run.add_argument("--module", metavar="IMPORT_PATH", help="'pkg.mod:ClassOrFactory' of the model / TaskModule.")
    run.add_argument("--module_kwargs", metavar="JSON", type=_json_dict, help="Keyword arguments for --module.")
    run.add_argument("--data", metavar="IMPORT_PATH", help="Callable returning {train, eval, test, predict, "
                     "data_collator}.")
    run.add_argument("--data_kwargs", metavar="JSON", type=_json_dict, help="Keyword arguments for --data.")
    run.add_argument("--datamodule", metavar="IMPORT_PATH", help="DataModule class (instead of --data).")
    run.add_argument("--datamodule_kwargs", metavar="JSON", type=_json_dict, help="Keyword arguments for "
                     "--datamodule.")
    run.add_argument("--print_config", action="store_true", help="Print the resolved config as YAML and exit.")
    run.add_argument("--ckpt_path", metavar="PATH|best|last", help="validate/test/predict: score the weights of "
                     "this checkpoint ('last': newest in output_dir, 'best': the run's best) instead of a fresh model.")
    groups = {key: p.add_argument_group(title) for key, title in _GROUPS.items()}
    for f in FitArguments.__dataclass_fields__.values():
        kinds = FitArguments.field_kinds(f.name)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        help_text = f"{f.metadata['help']} (default: {default!r})".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        kwargs["metavar"] = "|".join(k.__name__.upper() for k in kinds if k is not type(None))
        if bool in kinds:
            kwargs.update(nargs="?", const="true")
        elif list in kinds:
            kwargs["nargs"] = "+"
        groups[field_group(f)].add_argument(f"--{f.name}", **kwargs)


def _unknown_message(tokens: Sequence[str]) -> str:
    names = [f"--{n}" for n in (*FitArguments.field_names(), *CONFIG_KEYS, "config", "print_config")]
    for token in tokens:
        if token.startswith("--"):
            flag = token.split("=", 1)[0]
            hint = did_you_mean("--" + flag[2:].replace("-", "_"), names)
            return f"unrecognized option {flag!r}.{hint} Run with --help to list the options."
    return f"unrecognized argument {tokens[0]!r}."


def _underscored(token: str) -> str:
    """``--learning-rate=1`` -> ``--learning_rate=1`` (flags may be spelled with dashes); other tokens unchanged."""
    if not token.startswith("--") or len(token) == 2:
        return token
    name, sep, value = token[2:].partition("=")
    return "--" + name.replace("-", "_") + sep + value


def build_arguments(argv: Sequence[str] | None = None) -> tuple[FitArguments, dict[str, Any]]:
    """Parse ``argv`` (``["fit", "--config", "run.yaml", ...]``) into ``FitArguments`` and the non-option keys.

    Returns:
        ``(args, extra)``; ``extra`` has ``command``, ``config`` (path or None), ``print_config`` and every key
        of :data:`CONFIG_KEYS` (``*_kwargs`` default to ``{}``, the others to None).

    Raises:
        SystemExit: status 2 on a usage error (unknown flag or config key, with "Did you mean"; unreadable config;
            an invalid option value), status 0 for ``--help``/``--version``.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, unknown = parser.parse_known_args([_underscored(token) for token in argv])
    command_parser = parser.commands[ns.command]  # type: ignore[attr-defined]
    if unknown:
        command_parser.error(_unknown_message(unknown))
    config: dict[str, Any] = {}
    if ns.config:
        try:
            config = dict(read_config(ns.config))
        except (OSError, ValueError) as err:
            command_parser.error(str(err))
    names = FitArguments.field_names()
    for key in config:
        if key not in names and key not in CONFIG_KEYS:
            command_parser.error(f"unknown config key {key!r} in {ns.config}.{did_you_mean(key, [*names, *CONFIG_KEYS])}")
    extra: dict[str, Any] = {"command": ns.command, "config": ns.config, "print_config": ns.print_config,
                             "ckpt_path": ns.ckpt_path}
    if ns.ckpt_path and ns.command not in ("validate", "test", "predict"):
        command_parser.error(f"--ckpt_path is for validate/test/predict; '{ns.command}' would ignore it "
                             "(to continue training use --resume_from_checkpoint PATH|last).")
    if ns.command in ("validate", "test", "predict") and getattr(ns, "resume_from_checkpoint", None):
        command_parser.error(f"--resume_from_checkpoint continues training; '{ns.command}' would ignore it. "
                             "Use --ckpt_path PATH|best|last to score a checkpoint's weights.")
    for key in CONFIG_KEYS:
        value = config.pop(key, None)
        flag = getattr(ns, key, None)
        if key.endswith("_kwargs"):
            if value is not None and not isinstance(value, dict):
                command_parser.error(f"config key {key!r} must be a mapping, got {value!r}.")
            value = {**(value or {}), **(flag or {})}
        elif flag is not None:
            value = flag
        if value is not None and not key.endswith("_kwargs") and not isinstance(value, str):
            command_parser.error(f"config key {key!r} must be an import path string, got {value!r}.")
        extra[key] = value
    flags = {name: _flag_value(name, value) for name, value in vars(ns).items() if name in names}
    try:
        args = FitArguments.from_dict({**config, **flags})
    except ValueError as err:
        command_parser.error(str(err))
    return args, extra


def _flag_value(name: str, value: Any) -> Any:
    """Raw flag text -> what ``FitArguments`` coerces: one ``nargs='+'`` value unwrapped, ``null`` -> None."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value == "null" and type(None) in FitArguments.field_kinds(name):
        return None
    return value


#: folders put on ``sys.path`` for the import paths of a run (the config file's folder, set by ``main``)
_SEARCH_PATHS: list[str] = []


def _importable_paths() -> None:
    """Put the config file's folder and the working directory on ``sys.path`` (as ``python -m`` puts the working
    directory), so ``module: mymodels:Net`` finds ``mymodels.py`` next to ``run.yaml`` without PYTHONPATH."""
    import os

    for folder in [*_SEARCH_PATHS, os.getcwd()]:
        if folder not in sys.path:
            sys.path.insert(0, folder)


def import_object(path: str) -> Any:
    """Import ``"pkg.mod:attr.sub"`` or ``"pkg.mod.attr"`` and return the object.

    Raises:
        CLIError: the module or attribute cannot be found (the message names the path).
    """
    _importable_paths()
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise CLIError(f"import path {path!r} must look like 'pkg.module:Name'.")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise CLIError(f"cannot import {module_name!r} (from {path!r}): {err}") from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise CLIError(f"{module_name!r} has no attribute {part!r} (from {path!r}).{did_you_mean(part, public)}")
        obj = getattr(obj, part)
    return obj


def _instantiate(path: str, kwargs: dict[str, Any]) -> Any:
    obj = import_object(path)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "parameters")):
        return obj(**kwargs)
    if kwargs:
        raise CLIError(f"{path!r} is an object, not a class or factory, so it cannot take keyword arguments.")
    return obj


def load_run_objects(extra: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """Build ``(module, data, datamodule)`` from the non-option keys (``data`` is ``{}`` with a datamodule).

    Raises:
        CLIError: no module, both or neither of data/datamodule, a bad import path, a data dict with unknown
            keys (with "Did you mean") or without the split the command needs.
    """
    command = extra["command"]
    if not extra.get("module"):
        raise CLIError("no module: set 'module: pkg.mod:ClassOrFactory' in the config or pass --module.")
    if extra.get("data") and extra.get("datamodule"):
        raise CLIError("set either 'data' or 'datamodule', not both.")
    if not extra.get("data") and not extra.get("datamodule"):
        raise CLIError("no data: set 'data: pkg.mod:make_data' (returning a dict of splits) or 'datamodule:'.")
    module = _instantiate(extra["module"], extra.get("module_kwargs") or {})
    if extra.get("datamodule"):
        return module, {}, _instantiate(extra["datamodule"], extra.get("datamodule_kwargs") or {})
    data = _instantiate(extra["data"], extra.get("data_kwargs") or {})
    if not isinstance(data, dict):
        raise CLIError(f"data callable {extra['data']!r} must return a dict with keys among {list(DATA_KEYS)}, "
                       f"got {type(data).__name__}.")
    for key in data:
        if key not in DATA_KEYS:
            raise CLIError(f"unknown data key {key!r} from {extra['data']!r}.{did_you_mean(str(key), DATA_KEYS)} "
                           f"Valid keys: {', '.join(DATA_KEYS)}.")
    needed = {"fit": ("train",), "validate": ("eval",), "test": ("test",), "predict": ("predict", "test")}[command]
    if not any(data.get(key) is not None for key in needed):
        raise CLIError(f"'{command}' needs data under {' or '.join(repr(k) for k in needed)}; "
                       f"{extra['data']!r} returned keys {sorted(data)}.")
    return module, data, None


def run_command(fit: Any, command: str, module: Any, data: dict[str, Any], datamodule: Any = None) -> Any:
    """Call the ``Fit`` method for ``command`` with the right data split and return its result."""
    if datamodule is not None:
        return getattr(fit, command)(module, datamodule=datamodule)
    collator = data.get("data_collator")
    if command == "fit":
        return fit.fit(module, data["train"], data.get("eval"), data_collator=collator)
    if command == "validate":
        return fit.validate(module, data["eval"], data_collator=collator)
    if command == "test":
        return fit.test(module, data["test"], data_collator=collator)
    split = data["predict"] if data.get("predict") is not None else data["test"]
    return fit.predict(module, split, data_collator=collator)


def run_estimate(args: FitArguments, extra: dict[str, Any]) -> int:
    """``taskfit estimate``: print :func:`taskfit.estimate_memory`'s table, then its bytes as one JSON line.

    The activation estimate traces the first training micro-batch when ``data`` (its ``train`` split) or a
    ``datamodule`` is given; without data it is reported as n/a.

    Raises:
        CLIError: no module, or a bad import path.
    """
    from taskfit.data.loaders import build_dataloader
    from taskfit.efficiency.estimate import estimate_memory

    if not extra.get("module"):
        raise CLIError("no module: set 'module: pkg.mod:ClassOrFactory' in the config or pass --module.")
    module = _instantiate(extra["module"], extra.get("module_kwargs") or {})
    loader = None
    if extra.get("datamodule"):
        dm = _instantiate(extra["datamodule"], extra.get("datamodule_kwargs") or {})
        dm.prepare_data()
        dm.setup("fit")
        loader = dm.train_dataloader()
    elif extra.get("data"):
        data = _instantiate(extra["data"], extra.get("data_kwargs") or {})
        if isinstance(data, dict) and data.get("train") is not None:
            loader = build_dataloader(data["train"], args, train=True, batch_size=args.per_device_train_batch_size,
                                      collate_fn=data.get("data_collator"), what="train dataset")
    batch = next(iter(loader), None) if loader is not None else None
    est = estimate_memory(module, args, batch)
    print(est.table())
    print(json.dumps(est.to_dict()), flush=True)
    return 0


def metrics_of(result: Any) -> dict[str, Any]:
    """The metrics dict of a ``Fit`` result: a dict itself, an object's ``.metrics`` (HF ``TrainOutput`` /
    ``PredictionOutput`` style), or a list of dicts merged in order; ``{}`` otherwise."""
    if isinstance(result, dict):
        return result
    metrics = getattr(result, "metrics", None)
    if isinstance(metrics, dict):
        return metrics
    if isinstance(result, (list, tuple)) and result and all(isinstance(r, dict) for r in result):
        return {k: v for r in result for k, v in r.items()}
    return {}


def _to_json(value: Any) -> Any:
    for convert in ("item", "tolist"):  # tensors and numpy values
        try:
            return getattr(value, convert)()
        except (AttributeError, TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def bench_main(argv: Sequence[str]) -> int:
    """``taskfit bench SUITE [--quick] [--check] ...``: the same as ``python -m benchmarks`` in a checkout.

    The suites live in the checkout's top-level ``benchmarks/`` folder, which wheels do not ship.

    Returns:
        The suite's exit status; 2 when no ``benchmarks/`` folder sits next to the package (a wheel install).
    """
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]  # lib/cli/main.py -> the checkout (lib/ maps to taskfit)
    if not (root / "benchmarks" / "__main__.py").is_file():
        print("taskfit bench: error: the benchmark suites run from a source checkout of taskfit (benchmarks/ is "
              "not part of the installed package); clone the repository, install it with `pip install -e .`, "
              "and run `taskfit bench SUITE` or `python -m benchmarks SUITE` there.", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.__main__ import main as benchmarks_main

    return benchmarks_main(list(argv), prog="taskfit bench")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taskfit`` console script.

    Returns:
        0 after a successful run (the metrics JSON is the last line of stdout; ``plot`` prints the PNG path);
        2 on a usage error found after parsing (pending option, bad import path, missing data, no metrics.csv to
        plot). Parsing errors exit via ``SystemExit(2)``.
    """
    tokens = sys.argv[1:] if argv is None else list(argv)
    if tokens[:1] == ["bench"]:  # F-BENCH-4: `taskfit bench SUITE` runs benchmarks/ of a source checkout
        return bench_main(tokens[1:])
    if tokens[:1] == ["convert"]:  # `taskfit convert CHECKPOINT OUT` (FSDP / DeepSpeed shards -> full weights)
        from taskfit.cli.checkpoints import convert_main

        return convert_main(tokens[1:])
    if tokens[:1] == ["plot"]:  # F-OBS-3: `taskfit plot RUN_DIR` has its own small parser
        from taskfit.loggers.plots import main as plot_main

        return plot_main(tokens[1:])
    args, extra = build_arguments(argv)
    command = extra["command"]
    if extra["config"]:
        import os

        _SEARCH_PATHS[:] = [os.path.dirname(os.path.abspath(extra["config"]))]
    if extra["print_config"]:
        import yaml

        keys = {k: v for k, v in extra.items() if k in CONFIG_KEYS and v not in (None, {})}
        print(yaml.safe_dump({**keys, **args.to_dict(redact=True)}, sort_keys=False), end="")
        return 0
    try:
        if command == "estimate":
            return run_estimate(args, extra)
        module, data, datamodule = load_run_objects(extra)
    except (CLIError, NotImplementedError) as err:
        print(f"taskfit {command}: error: {err}", file=sys.stderr)
        return 2
    from taskfit.fit.fit import Fit  # imported only when a command runs: `taskfit --help` stays fast

    fit = Fit(args=args)
    path = None
    if extra.get("ckpt_path"):
        from taskfit.fit.ckpt_path import resolve_ckpt_path
        from taskfit.cli.checkpoints import load_checkpoint_weights

        try:
            path = resolve_ckpt_path(extra["ckpt_path"], args.output_dir, fit.strategy.checkpoint_io)
        except ValueError as err:
            print(f"taskfit {command}: error: {err}", file=sys.stderr)
            return 2
        load_checkpoint_weights(fit, module, path)
    if command != "fit":
        _log_apart(fit, command, path)
    result = run_command(fit, command, module, data, datamodule)
    sys.stdout.flush()
    if fit.is_global_zero:  # one result line, however many processes ran
        metrics = json.loads(json.dumps(metrics_of(result), default=_to_json))
        if command == "predict":
            _report_predictions(result, metrics, fit.args, path)
        print(json.dumps(metrics), flush=True)
    return 0


def _log_apart(fit: Any, command: str, ckpt_path: str | None) -> None:
    """Point ``fit``'s loggers at the evaluation's own folder (``<logging_dir>/<command>-<checkpoint>``): a fresh
    run logs at step 0, and in the training run's ``metrics.csv`` those rows would bend its curves back to 0."""
    from taskfit.cli.outputs import evaluation_logging_dir
    from taskfit.loggers import build_loggers

    fit.args = fit.args.replace(logging_dir=evaluation_logging_dir(fit.args, command, ckpt_path))
    fit.loggers = build_loggers(fit.args)


def _report_predictions(result: Any, metrics: dict[str, Any], args: FitArguments, ckpt_path: str | None) -> None:
    """Write ``predictions.pt`` and ``predict_results.json`` into ``<output_dir>/predict-<checkpoint>`` (for a
    remote ``output_dir``, into the evaluation's local logging folder) and say where on stdout."""
    import os

    from taskfit.cli.outputs import evaluation_name, save_predictions

    folder = (args.resolved_logging_dir if "://" in args.output_dir else
              os.path.join(args.output_dir, evaluation_name("predict", ckpt_path)))
    pred_path, metrics_path = save_predictions(result, metrics, folder)
    print(f"taskfit predict: predictions written to {pred_path}, metrics to {metrics_path}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
