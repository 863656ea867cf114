"""The Lightning names, for scripts written against ``lightning`` 2.x: change ``import lightning as L`` (or ``from
lightning.pytorch import ...``) into ``import taskfit.lightning as L`` (``from taskfit.lightning import ...``).

``LightningModule`` is :class:`taskfit.TaskModule` (``self.log`` without a trainer warns), ``LightningDataModule``
is :class:`taskfit.DataModule`, ``Callback`` is the Lightning-style half of :class:`taskfit.Callback` (its base class
:class:`taskfit.callbacks.base.LightningCallback`: Lightning's members only). ``Trainer`` is :class:`taskfit.Fit` with
Lightning's constructor, defaults and return values: it maps its arguments to ``FitArguments`` (docs/lightning.md has the table), keeps
Lightning's loop semantics where they differ from HF's (no clipping by default, validation every epoch when there
is validation data, ``max_epochs`` and ``max_steps`` whichever first, ``current_epoch`` counting finished epochs
after training) and runs the same loops, strategies, precision plugins and checkpoint format. A flag it does not
support raises before any work, naming the flag. ``callbacks`` and ``loggers`` hold the built-ins under Lightning's
names.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import Any, Iterator

from taskfit.callbacks.base import LightningCallback as Callback
from taskfit.callbacks.console import LogPrinter
from taskfit.callbacks.order import lightning_order
from taskfit.callbacks.prediction_writer import record_batch_indices
from taskfit.callbacks.model_checkpoint import ModelCheckpoint as ModelCheckpointBase
from taskfit.core.hparams import drop_unpicklable
from taskfit.core.module import TaskModule
from taskfit.data.loaders import DataModule
from taskfit.fit.fit import Fit
from taskfit.lightning import callbacks, loggers, profilers  # modules: `from taskfit.lightning.callbacks import X`
from taskfit.lightning.eval_stage import eval_stage
from taskfit.lightning.flags import (
    announce_batch_limits, apply_barebones, fit_options, lightning_precision, limit_property, loop_policy,
    warn_precision,
)
from taskfit.lightning.internal_callbacks import DoorAPI, check_state_keys, split_callbacks
from taskfit.lightning.loop_schedule import LightningLoop as _LightningLoop
from taskfit.lightning.logged import (
    LoggedMetrics, MetricDict, attach_logging, finalize_loggers, lightning_row, per_loader, reset_metrics, send_row,
)
from taskfit.lightning.model_checkpoint import check_checkpoint_exists
from taskfit.lightning.progress_metrics import ProgressBarNames
from taskfit.lightning.torch_flags import set_deterministic
from taskfit.lightning.trainer_setup import (
    _default_callbacks, _default_logger, _env_defaults, _is_datamodule, _overrides, _Predictions,
)
from taskfit.lightning.trainer_state import (
    DataModuleState, LightningState, new_status, profiled_datamodule, running,
)
from taskfit.lightning.seed import seed_everything
from taskfit.lightning.utilities import (
    CombinedLoader, MisconfigurationException, PossibleUserWarning, is_overridden, possible_user_warning,
)

_cb, _lg, _pf = callbacks, loggers, profilers

__all__ = ["LightningModule", "LightningDataModule", "Trainer", "Callback", "seed_everything", "callbacks",
           "loggers", "profilers", "is_overridden", "PossibleUserWarning", "CombinedLoader",
           "MisconfigurationException"]


class LightningModule(TaskModule):
    """:class:`taskfit.TaskModule` as Lightning's ``LightningModule``; the one difference: ``self.log`` on a module
    no trainer holds warns and does nothing (Lightning's, so step methods can be tested alone) where a plain
    ``TaskModule`` raises RuntimeError."""

    _log_without_fit_warns = True


LightningDataModule = DataModule


class Trainer(Fit):
    """:class:`taskfit.Fit` with ``lightning.pytorch.Trainer``'s constructor (every argument keyword-only, with
    Lightning 2.x's defaults), methods and return values. ``accelerator``, ``strategy``, ``devices``, ``num_nodes``,
    ``precision``, ``plugins`` take the same names and objects as ``Fit``; the other flags map to ``FitArguments``
    (:func:`fit_options`; docs/lightning.md). ``logger`` None/True gives a TensorBoard (else CSV) logger under
    ``default_root_dir/lightning_logs/version_N``; ``enable_checkpointing`` adds a ``ModelCheckpoint`` into its
    ``checkpoints`` folder (taskfit checkpoint folders, not ``.ckpt`` files). ``PL_TRAINER_<FLAG>`` environment
    variables give the flags' defaults (Lightning's ``_defaults_from_env_vars``); ``val_check_interval`` may be a
    time (``"DD:HH:MM:SS"``, ``datetime.timedelta``, a dict of its arguments).

    Raises:
        NotImplementedError: ``sync_batchnorm``, ``model_registry``,
            ``benchmark=True`` (the message names the flag), before any work.
        ValueError: a float ``val_check_interval`` outside [0, 1], a malformed time, ``check_val_every_n_epoch``
            < 1, or None with a float ``val_check_interval``; with ``barebones=True`` a flag asking for what it turns
            off (Lightning's message); as ``Fit`` (unknown accelerator, strategy, precision...).
    """

    seed_on_init = False  # Lightning's constructor leaves the random state alone

    @_env_defaults
    def __init__(self, *, accelerator: Any = "auto", strategy: Any = "auto", devices: Any = "auto",
                 num_nodes: int = 1, precision: Any = None, logger: Any = None, callbacks: Any = None,
                 fast_dev_run: int | bool = False, max_epochs: int | None = None, min_epochs: int | None = None,
                 max_steps: int = -1, min_steps: int | None = None, max_time: Any = None,
                 limit_train_batches: int | float | None = None, limit_val_batches: int | float | None = None,
                 limit_test_batches: int | float | None = None, limit_predict_batches: int | float | None = None,
                 overfit_batches: int | float = 0.0, val_check_interval: Any = None,
                 check_val_every_n_epoch: int | None = 1, num_sanity_val_steps: int | None = None,
                 log_every_n_steps: int | None = None, enable_checkpointing: bool | None = None,
                 enable_progress_bar: bool | None = None, enable_model_summary: bool | None = None,
                 accumulate_grad_batches: int = 1, gradient_clip_val: int | float | None = None,
                 gradient_clip_algorithm: str | None = None, deterministic: Any = None, benchmark: bool | None = None,
                 inference_mode: bool = True, use_distributed_sampler: bool = True, profiler: Any = None,
                 detect_anomaly: bool = False, barebones: bool = False, plugins: Any = None,
                 sync_batchnorm: bool = False, reload_dataloaders_every_n_epochs: int = 0,
                 default_root_dir: Any = None, enable_autolog_hparams: bool = True,
                 model_registry: str | None = None) -> None:
        flags = dict(locals())
        flags.pop("self")
        flags.pop("__class__", None)
        apply_barebones(flags)
        options = fit_options(flags)
        root = options["output_dir"]
        lightning_loggers = _default_logger(flags["logger"], root, barebones)
        self.barebones = barebones
        self._fit_max_epochs: int | None = None  # Lightning's parsed max_epochs, set when fit starts
        given = callbacks if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks else [])
        self._flags = flags
        self._lightning_status = new_status()
        set_deterministic(deterministic)
        self._val_check_interval = val_check_interval
        self.datamodule: Any = None
        self._predictions: _Predictions | None = None
        plugins = plugins if isinstance(plugins, (list, tuple)) or plugins is None else [plugins]
        precision, precision_said = lightning_precision(precision, accelerator, strategy)  # 16-mixed on CPU: bf16
        super().__init__(accelerator=accelerator, strategy=strategy, devices=devices, num_nodes=num_nodes,
                         precision=precision, callbacks=_default_callbacks(flags, list(given)),
                         # fast_dev_run: Lightning's DummyLogger in place of the loggers (user calls still run)
                         loggers=[_lg.DummyLogger()] if fast_dev_run and lightning_loggers else lightning_loggers,
                         plugins=plugins, **options)
        warn_precision(precision_said)  # after Fit.__init__: its rank-zero gate knows this process's rank now
        if not flags["fast_dev_run"]:  # Lightning announces no limits in fast_dev_run
            announce_batch_limits(flags)
        # Lightning's loop semantics where they differ from HF's (global_step under manual optimization, min_epochs
        # / min_steps, reloaded loaders, no eval_ prefix, checkpoint callbacks last), chosen once here
        self.loop_policy = loop_policy(flags)
        # Lightning prints no per-log lines when the bar is off
        visible, self._internal_callbacks = split_callbacks(
            [cb for cb in self.callbacks if not isinstance(cb, LogPrinter)], list(given))
        self.callbacks = lightning_order(visible)
        check_state_keys(self.callbacks)
        self._api = DoorAPI(self)  # its hook runner also calls the door's own callbacks (not in trainer.callbacks)
        self._hooks = self._api.hook_runner(self.module)  # the module's hooks stay bound between stages
        self._loop: _LightningLoop = next(c for c in self._internal_callbacks if isinstance(c, _LightningLoop))
        # Lightning's metric dicts hold tensors, and only what self.log wrote
        self.callback_metrics, self.logged_metrics = MetricDict(), MetricDict()

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """A log row as Lightning's ``_LoggerConnector.log_metrics``: only what ``self.log`` wrote (no evaluation
        speed rows, no end-of-run summary) into ``callback_metrics``/``logged_metrics`` and, with ``epoch``, to the
        loggers at Lightning's step (:mod:`taskfit.lightning.logged`); ``state.log_history`` keeps the row."""
        row = lightning_row(self, logs)
        if row is None:
            return
        st = self.state
        st.log_history.append({**row, "epoch": row.get("epoch", st.epoch), "step": st.global_step})
        send_row(self, row)
        if self._hooks.hf["on_log"]:
            self._hooks.call_hf("on_log", self.args, st, self.control, logs=row)

    # ------------------------------------------------------------------------------------------ stages ---
    def _eval_plan(self, model: Any, val: Any, datamodule: Any) -> str:
        # a datamodule is the loaders' only source (Lightning's _DataLoaderSource): the module's val_dataloader
        # counts only without one
        has_val = val is not None or (_overrides(datamodule, "val_dataloader", DataModule) if datamodule is not None
                                      else _overrides(model, "val_dataloader", TaskModule))
        if not has_val or not _overrides(model, "validation_step", TaskModule) or \
                self._flags["limit_val_batches"] == 0:
            return "no"
        loop = self._loop
        loop.scheduled = not loop.default_schedule  # then _LightningLoop asks for each validation
        return "epoch" if loop.default_schedule else "no"

    def fit(self, model: Any = None, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: Any = None, weights_only: bool | None = None) -> None:
        """Train as ``lightning.Trainer.fit``: ``train_dataloaders`` may be a datamodule; ``ckpt_path`` (a
        checkpoint folder, ``"last"``) resumes exactly. Validation runs every epoch when there is validation data
        (``val_dataloaders``, a datamodule's or the module's ``val_dataloader``) and a ``validation_step``.

        Raises:
            As :meth:`taskfit.Fit.fit`.
        """
        if datamodule is None and train_dataloaders is not None and _is_datamodule(train_dataloaders):
            datamodule, train_dataloaders = train_dataloaders, None
        self.datamodule = datamodule
        if isinstance(getattr(model, "hparams", None), dict):
            drop_unpicklable(model.hparams)  # Lightning cleans them as every run starts (clean_namespace)
        self._parse_max_epochs()
        if val_dataloaders is not None and model is not None and not _overrides(model, "validation_step",
                                                                                TaskModule):
            warnings.warn("You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.",
                          UserWarning, stacklevel=2)  # Lightning's warning; Fit refuses eval data without a step
            val_dataloaders = None
        self.args = self.args.replace(eval_strategy=self._eval_plan(model, val_dataloaders, datamodule))
        check_checkpoint_exists(ckpt_path)
        resume = self._last_checkpoint() if ckpt_path == "last" else ckpt_path
        self.ckpt_path = None if resume in (None, True) else str(resume)  # Lightning's trainer.ckpt_path
        with self._lightning_run("fit", datamodule, model):
            super().fit(model, train_dataloaders, val_dataloaders, datamodule=datamodule,
                        resume_from_checkpoint=str(resume) if resume not in (None, True) else resume,
                        weights_only=True if weights_only is None else weights_only)

    @contextlib.contextmanager
    def _lightning_run(self, fn: str, datamodule: Any, model: Any = None) -> Iterator[None]:
        """Around one trainer method: ``trainer.state`` (running, finished or interrupted), the datamodule's
        ``trainer``, its ``state_dict`` in checkpoints and its hooks timed by ``trainer.profiler``; the callbacks
        get the module's ``log``/``log_dict``, the metric dicts start empty; after ``validate``/``test``/``predict`` the loggers are finalized."""
        attach_logging(self.callbacks, model if model is not None else self.module)
        reset_metrics(self)
        if datamodule is not None:
            datamodule.trainer = self
        # not an entry of trainer.callbacks (Lightning lists none): the always-present loop callback carries it
        self._loop.datamodule_state = None if datamodule is None else DataModuleState(datamodule, self.profiler)
        self._hooks = self._api.hook_runner(self.module)  # the module's hooks stay bound between stages
        try:
            with running(self, fn), profiled_datamodule(datamodule, self.profiler):
                yield
            if fn != "fit":  # Lightning finalizes the loggers after every trainer method (Fit: after fit)
                finalize_loggers(self)
        finally:
            self._loop.datamodule_state = None
            self._hooks = self._api.hook_runner(self.module)  # the module's hooks stay bound between stages

    def _last_checkpoint(self) -> str | None:
        """``ckpt_path="last"`` for ``fit`` (:func:`taskfit.lightning.model_checkpoint.last_checkpoint`)."""
        from taskfit.lightning.model_checkpoint import last_checkpoint

        return last_checkpoint(self)

    def save_checkpoint(self, filepath: Any = None, weights_only: bool = False, storage_options: Any = None) -> str:
        """``lightning.Trainer.save_checkpoint``: a complete checkpoint folder at ``filepath``. Raises
        NotImplementedError for ``weights_only=True`` or ``storage_options`` (a checkpoint is always complete)."""
        if weights_only or storage_options is not None:
            raise NotImplementedError("Trainer.save_checkpoint(weights_only=True, storage_options=) is not supported")
        return super().save_checkpoint(None if filepath is None else os.fspath(filepath))

    def _evaluate(self, stage: str, model: Any, dataloaders: Any, ckpt_path: Any,
                  datamodule: Any) -> list[dict[str, float]]:
        if datamodule is None and dataloaders is not None and _is_datamodule(dataloaders):
            datamodule, dataloaders = dataloaders, None
        if datamodule is not None:
            self.datamodule = datamodule
        check_checkpoint_exists(ckpt_path)
        run = super().validate if stage == "validate" else super().test
        with self._lightning_run(stage, datamodule, model), eval_stage(self, model, stage, datamodule,
                                                              dataloaders) as (dataloaders, runs):
            if not runs:  # limit_*_batches=0: Lightning runs no loop
                return []
            # no "eval_"/"test_" prefix on logged names: Lightning returns them as logged
            metrics = run(model, dataloaders, ckpt_path=ckpt_path, metric_key_prefix="")
        n = len(dataloaders) if isinstance(dataloaders, (list, tuple)) else 1
        logged = next((c for c in self._internal_callbacks if isinstance(c, LoggedMetrics)), None)
        return per_loader(metrics, n, logged.loader_of if logged is not None else {})

    def validate(self, model: Any = None, dataloaders: Any = None, ckpt_path: Any = None, verbose: bool = True,
                 datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        """``lightning.Trainer.validate``: the values logged in ``validation_step``, one dict per dataloader."""
        return self._evaluate("validate", model, dataloaders, ckpt_path, datamodule)

    def test(self, model: Any = None, dataloaders: Any = None, ckpt_path: Any = None, verbose: bool = True,
             datamodule: Any = None, weights_only: bool | None = None) -> list[dict[str, float]]:
        """``lightning.Trainer.test``: the values logged in ``test_step``, one dict per dataloader."""
        return self._evaluate("test", model, dataloaders, ckpt_path, datamodule)

    def predict(self, model: Any = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: Any = None,
                weights_only: bool | None = None) -> list[Any] | None:
        """``lightning.Trainer.predict``: the list of ``predict_step`` outputs, one per batch (a list of such
        lists with several dataloaders); None with ``return_predictions=False``."""
        if datamodule is None and dataloaders is not None and _is_datamodule(dataloaders):
            datamodule, dataloaders = dataloaders, None
        if datamodule is not None:
            self.datamodule = datamodule  # attached for later stages too, as Lightning's trainer.datamodule
        collector = _Predictions()
        self._internal_callbacks.append(collector)
        self._hooks = self._api.hook_runner(self.module)  # the module's hooks stay bound between stages
        try:
            with self._lightning_run("predict", datamodule), eval_stage(self, model, "predict", datamodule,
                                                                        dataloaders) as (dataloaders, runs):
                if not runs:  # limit_predict_batches=0: no loop, nothing returned (Lightning)
                    return None
                # for BasePredictionWriter; the module's own predict_dataloader() too (asked for here then)
                dataloaders = record_batch_indices(dataloaders, self.callbacks,
                                                   model if model is not None else self.module)
                super().predict(model=model, data=dataloaders, ckpt_path=ckpt_path)
        finally:
            self._internal_callbacks.remove(collector)
            self._hooks = self._api.hook_runner(self.module)  # the module's hooks stay bound between stages
        if return_predictions is False:
            return None
        per = [collector.outputs[i] for i in sorted(collector.outputs)]
        return per[0] if len(per) == 1 else per

    # --------------------------------------------------------------- Lightning's trainer attributes ---
    @property
    def state(self) -> Any:
        """The run's loop state (``global_step``, ``current_epoch``...) with Lightning's ``TrainerState`` fields
        ``fn``, ``status``, ``stage``, ``finished`` and ``stopped``."""
        loop_state = Fit.state.fget(self)
        view = self.__dict__.get("_state_view")
        if view is None or view._loop_state is not loop_state:  # one view per loop state: no object per read
            view = self.__dict__["_state_view"] = LightningState(self, loop_state)
        return view

    @state.setter
    def state(self, value: Any) -> None:
        Fit.state.fset(self, value._loop_state if isinstance(value, LightningState) else value)

    @property
    def interrupted(self) -> bool:
        """True when the last trainer method was interrupted (an exception, Ctrl-C), as Lightning's."""
        return self.state.stopped

    @property
    def profiler(self) -> Any:
        """The run's profiler (``profiler=`` given as an object or a name), else one that records nothing
        (Lightning's ``PassThroughProfiler``)."""
        from taskfit.callbacks.profilers import PassThroughProfiler, Profiler

        own = self.__dict__.get("_internal_callbacks", self.__dict__.get("callbacks", []))  # before __init__ ends
        found = next((c for c in own if isinstance(c, Profiler)), None)
        if found is None:
            found = self.__dict__.setdefault("_pass_through_profiler", PassThroughProfiler())
        return found

    @property
    def gradient_clip_algorithm(self) -> str | None:
        """The ``gradient_clip_algorithm`` flag (None when not given, as Lightning)."""
        return self._flags["gradient_clip_algorithm"]

    @property
    def current_epoch(self) -> int:
        """Epochs finished after training ends (Lightning increments it when an epoch ends); during training
        the zero-based index of the running epoch."""
        loop = next((c for c in self._internal_callbacks if isinstance(c, _LightningLoop)), None)
        return self.state.current_epoch + (1 if loop is not None and loop.trained else 0)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return self.state.global_step

    @property
    def max_epochs(self) -> int | None:
        """The ``max_epochs`` flag: None when not given until ``fit`` starts, then 1000 when neither ``max_epochs``
        nor ``max_steps`` was given (no ``Timer``), else -1; 1 under ``fast_dev_run`` (Lightning's values)."""
        f = self._flags
        if f["fast_dev_run"]:
            return 1
        return f["max_epochs"] if f["max_epochs"] is not None else self._fit_max_epochs

    @property
    def max_steps(self) -> int:
        """The ``max_steps`` flag (-1: no step limit); the ``fast_dev_run`` batches under it (Lightning)."""
        f = self._flags
        return int(f["fast_dev_run"]) if f["fast_dev_run"] else f["max_steps"]

    def _parse_max_epochs(self) -> None:
        """Lightning's ``_parse_loop_limits`` at the start of ``fit``: ``max_epochs`` not given becomes 1000 with its
        ``PossibleUserWarning`` when there is no ``max_steps`` and no ``Timer``, else -1 (no epoch limit)."""
        f = self._flags
        if f["max_epochs"] is not None or f["fast_dev_run"]:
            return
        if f["max_steps"] in (None, -1) and not any(isinstance(c, _cb.Timer) for c in self.callbacks):
            warnings.warn("`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, set "
                          "`max_epochs=-1`.", possible_user_warning(), stacklevel=3)
            self._fit_max_epochs = 1000
        else:
            self._fit_max_epochs = -1

    @property
    def min_epochs(self) -> int:
        """Epochs trained before a stop request (``should_stop``, ``EarlyStopping``) ends training: the flag, 1
        when only ``min_steps`` is given, else 0 (Lightning's parsed value)."""
        return self.loop_policy.min_epochs

    @property
    def reload_dataloaders_every_n_epochs(self) -> int:
        """Epochs between new train and validation loaders (the flag; 0: never)."""
        return self.loop_policy.reload_dataloaders_every_n_epochs

    @property
    def min_steps(self) -> int | None:
        """Optimizer steps taken before a stop request ends training (the flag; None: no minimum)."""
        return self.loop_policy.min_steps

    @property
    def estimated_stepping_batches(self) -> int:
        """Optimizer steps of the whole run (what ``OneCycleLR(total_steps=...)`` needs): with both ``max_epochs``
        and ``max_steps``, the smaller of ``max_steps`` and the epochs' steps (Lightning's estimate)."""
        self._plan_now()
        steps, f, batches = self.state.max_steps, self._flags, self.state.batches_per_epoch
        if f["max_epochs"] is not None and f["max_steps"] not in (None, -1) and batches:
            per_epoch = math.ceil(batches / self.args.gradient_accumulation_steps)
            steps = min(steps, per_epoch * max(f["max_epochs"], 1))
        return steps

    @property
    def val_check_interval(self) -> int | float:
        """The ``val_check_interval`` flag (1.0 by default: once per epoch)."""
        vci = self._flags["val_check_interval"]
        return 1.0 if vci is None else vci

    @property
    def check_val_every_n_epoch(self) -> int | None:
        """The ``check_val_every_n_epoch`` flag."""
        return self._flags["check_val_every_n_epoch"]

    @property
    def num_training_batches(self) -> int | float:
        """Batches per training epoch on this process (``inf`` without a length)."""
        self._plan_now()
        return self.state.batches_per_epoch or float("inf")

    def _plan_now(self) -> None:
        """Ask for the train loader and make the step plan now when a running ``fit`` has not yet (read in
        ``configure_optimizers``: Lightning builds the train loader early then too)."""
        build = getattr(self._run, "build_plan", None)
        if build is not None:
            build()

    @property
    def train_dataloader(self) -> Any:
        """The training loader of the latest ``fit`` (its batch limit applied; None before), as Lightning's."""
        return getattr(self._run, "train_loader", None)

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader of the latest ``fit`` (a list with several; None without), as Lightning's."""
        loaders = list((getattr(self._run, "eval_loaders", None) or {}).values())
        return None if not loaders else loaders[0] if len(loaders) == 1 else loaders

    @property
    def num_val_batches(self) -> list[int | float]:
        """Lightning's ``trainer.num_val_batches``: the validation batches per loader of the latest run (its batch
        limits applied; ``inf`` for a loader without a length); ``[]`` without validation data."""
        loaders = getattr(self._run, "eval_loaders", None) or {}
        return [len(v) if hasattr(v, "__len__") else float("inf") for v in loaders.values()]

    @property
    def logger(self) -> Any:
        """The first logger (None without any)."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's ``log_dir`` (``default_root_dir`` without a logger), as Lightning."""
        return getattr(self.logger, "log_dir", None) or self.args.output_dir

    @property
    def default_root_dir(self) -> str:
        """The ``default_root_dir`` flag (the working directory by default)."""
        return self.args.output_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        """The ``ModelCheckpoint`` callbacks."""
        return [c for c in self.callbacks if isinstance(c, ModelCheckpointBase)]

    @property
    def checkpoint_callback(self) -> Any:
        """The first ``ModelCheckpoint`` (None without)."""
        return next(iter(self.checkpoint_callbacks), None)

    @property
    def early_stopping_callback(self) -> Any:
        """The first ``EarlyStopping`` (None without)."""
        return next((c for c in self.callbacks if isinstance(c, _cb.EarlyStopping)), None)

    @property
    def lightning_module(self) -> Any:
        """The module being run (the ``LightningModule``)."""
        return self.module

    @property
    def precision(self) -> str:
        """The precision name, e.g. ``"32-true"``, ``"bf16-mixed"``."""
        return str(self.args.precision or "32-true")

    @property
    def num_devices(self) -> int:
        """Processes taking part."""
        return self.world_size

    limit_train_batches, limit_val_batches = limit_property("limit_train_batches"), limit_property("limit_val_batches")
    limit_test_batches, limit_predict_batches = limit_property("limit_test_batches"), limit_property("limit_predict_batches")

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-batches per optimizer step."""
        return self.args.gradient_accumulation_steps

    @property
    def gradient_clip_val(self) -> float | None:
        """The clipping value (None when off, as Lightning's default)."""
        return self.args.max_grad_norm or None

    @property
    def log_every_n_steps(self) -> int:
        """Logging interval in optimizer steps (0: no logging, as ``log_every_n_steps=0`` and barebones)."""
        return 0 if str(self.args.logging_strategy) in ("no", "IntervalStrategy.NO") else int(self.args.logging_steps)

    @property
    def num_sanity_val_steps(self) -> int:
        """Validation batches of the sanity check."""
        return self.args.num_sanity_val_steps

    @property
    def _detect_anomaly(self) -> bool:
        """The ``detect_anomaly`` flag (Lightning keeps it under this name)."""
        return bool(self._flags["detect_anomaly"])

    @property
    def fast_dev_run(self) -> int | bool:
        """The ``fast_dev_run`` flag."""
        return self.args.fast_dev_run

    @property
    def training(self) -> bool:
        """True while the training loop runs (not during validation inside ``fit``)."""
        run = self.run
        return run is not None and run.stage == "fit" and self.module is not None and self.module.training

    @property
    def validating(self) -> bool:
        """True during a validation pass (``validate`` or inside ``fit``), sanity check excluded."""
        run = self.run
        return run is not None and not self.sanity_checking and (
            run.stage == "validate" or (run.stage == "fit" and self.module is not None and not self.module.training))

    @property
    def testing(self) -> bool:
        """True during ``test``."""
        return self.run is not None and self.run.stage == "test"

    @property
    def predicting(self) -> bool:
        """True during ``predict``, its set-up and tear-down hooks included (Lightning's ``state.stage``)."""
        return self._lightning_status["stage"] == "predict" or self.run is not None and self.run.stage == "predict"

    @property
    def collects_logs(self) -> bool:
        """True while a trainer method other than ``predict`` runs: ``self.log`` has somewhere to go (Lightning's
        ``trainer._results`` is not None); read by ``self.log`` through ``LoopPolicy.log_hooks``."""
        return self._lightning_status["stage"] is not None and not self.predicting

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        """Lightning's ``trainer.progress_bar_metrics``: the latest values logged with ``prog_bar=True``
        (``name``, or ``name_step``/``name_epoch`` for values logged on both), ``logger=False`` ones included."""
        names = next((c for c in self._internal_callbacks if isinstance(c, ProgressBarNames)), None)
        return names.metrics(self.callback_metrics) if names is not None else {}

    @property
    def progress_bar_callback(self) -> Any:
        """The progress bar callback (None without)."""
        return next((c for c in self.callbacks if isinstance(c, _cb.ProgressBar)), None)
