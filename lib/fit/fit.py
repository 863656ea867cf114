"""``Fit``: how to run a TaskModule (F-CORE-3). Holds the configuration: the strategy (and through it
accelerator, precision and checkpoint IO), callbacks, loggers and arguments; every ``fit``/``validate``/``test``/
``predict`` call works on a run of its own (:mod:`taskfit.fit.run`, public as ``fit.run``) driven by the loops. Fit
owns a few objects its public methods delegate to: the run launcher (:class:`~taskfit.fit.run.RunLauncher`), the
training stage (:mod:`taskfit.fit.training`), the evaluation stages (:mod:`taskfit.fit.stages`) and the HF override
adapter (:mod:`taskfit.fit.hf_overrides`). Mirrors Lightning's ``Trainer`` plus the HF ``Trainer`` API, whose members
besides the stages are functions of :mod:`taskfit.fit.hf_members` bound into the class body."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable

from lightning_utilities.core.rank_zero import rank_zero_only
from torch import nn

from taskfit import efficiency
from taskfit.arguments.fit_arguments import FitArguments
from taskfit.arguments.strategy_options import StrategyOptions
from taskfit.callbacks.console import configure_console
from taskfit.connector import resolve_components
from taskfit.data.loaders import DataModule, data_options, num_examples, num_tokens
from taskfit.fit.hf_api import HFTrainerAPI
from taskfit.fit import hf_members
from taskfit.fit.hf_overrides import HFAdapter, default_collator
from taskfit.fit.hpo import hyperparameter_search
from taskfit.fit.topology import Topology
from taskfit.fit.options import default_callbacks, fit_arguments
from taskfit.fit.run import Run, RunLauncher
from taskfit.fit.stages import EvaluationStages, _hf_positional
from taskfit.fit.training import TrainingStage
from taskfit.loggers import Logger, build_loggers, send_summary
from taskfit.loops.policy import LoopPolicy
from taskfit.loops.state import FitControl, FitState
from taskfit.metrics import MemoryTracker, PredictionOutput, TrainOutput
from taskfit.seed import enable_full_determinism, seed_everything

log = logging.getLogger("taskfit")

class Fit(Topology):
    """Runs training, evaluation and prediction of a :class:`TaskModule` or a plain HF-style model.

    Args:
        args (FitArguments | dict | None): the options; every keyword of ``FitArguments`` may also be passed
            directly (``Fit(max_steps=10)``), overriding ``args``.
        accelerator (str | Accelerator | None): ``"cpu"``, ``"auto"``, ... (F-ACC-1).
        strategy (str | Strategy | None): ``"auto"``, ``"single_device"``, ``"ddp"``, ``"fsdp"``, ... (F-STRAT).
        devices (int | str | list[int] | None): devices/processes (``"auto"``, a count, indices, ``-1``).
        num_nodes (int | None): machines.
        precision (str | Precision | None): ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"64-true"``...
        callbacks (list[Callback] | None): observers (``Callback`` or HF ``TrainerCallback`` objects).
        loggers (list[Logger] | None): metric sinks in addition to those named by ``report_to``.
        plugins (list | None): ``Precision`` / ``CheckpointIO`` instances.
        compute_metrics (Callable[[EvalPrediction], dict] | None): HF-style metric function.
        preprocess_logits_for_metrics (Callable[[Tensor, Tensor], Tensor] | None): applied per batch.
        compute_loss_func (Callable[[outputs, labels, num_items_in_batch], Tensor] | None): custom loss for
            plain models (HF ``compute_loss_func``); subclassing ``Fit`` and overriding :meth:`compute_loss`
            works too.
        optimizers (tuple[Optimizer | None, LRScheduler | None]): HF-style pre-built optimizer/scheduler.
        data_collator (Callable | None): default collator for datasets; None gives HF's default, kept in
            ``fit.data_collator``: ``DataCollatorWithPadding(processing_class)`` for a tokenizer or feature
            extractor, else :func:`~taskfit.data.loaders.default_collate_with_labels` (HF
            ``default_data_collator``'s renaming of ``label``/``label_ids``, plus tuple samples).
        processing_class (Any | None): tokenizer/processor saved with the model (``tokenizer`` is an alias);
            with a tokenizer and no collator, batches are padded with ``DataCollatorWithPadding``.
        model_init (Callable[[], nn.Module] | None): builds a fresh model when ``fit`` gets none.
        model (nn.Module | None): the model ``fit``/``train`` uses when none is passed (HF ``Trainer(model=...)``).
        train_dataset, eval_dataset (Any): the data ``fit``/``train`` and ``evaluate`` use when none is passed
            (HF ``Trainer(train_dataset=..., eval_dataset=...)``).
        optimizer_cls_and_kwargs (tuple[type, dict] | None): an optimizer class and its keyword arguments, built
            over the decay / no-decay parameter groups (``weight_decay`` from ``args``), as HF's argument of that
            name; ``optimizers=`` wins when both are given.

    With these keywords ``Fit(model=m, args=a, train_dataset=d).train()`` is the HF ``Trainer`` call shape;
    ``taskfit.hf.Trainer`` only adds HF's positional order. ``args.seed`` is set here and again as ``fit`` starts
    (HF's ``Trainer.__init__`` and ``train`` do the same): a model built after ``Fit(...)`` is the same every run.

    Raises:
        ValueError: unknown option names or values (with "did you mean"), incompatible components.
        NotImplementedError: an option or component whose feature has not landed yet (names the issue).
    """

    #: Where Lightning's loop semantics differ from HF's, HF's choices (the Lightning door's ``Trainer`` sets its
    #: own): handed to the fit loop, chosen once, never per step. Frozen, so one instance serves every ``Fit``.
    loop_policy: LoopPolicy = LoopPolicy()
    seed_on_init: bool = True  #: seed in the constructor as HF does (Lightning's Trainer does not)

    def __init__(self, args: FitArguments | dict | None = None, *, accelerator: Any = None, strategy: Any = None,
                 devices: Any = None, num_nodes: int | None = None, precision: Any = None,
                 callbacks: list[Any] | None = None, loggers: list[Logger] | None = None,
                 plugins: list[Any] | None = None, compute_metrics: Callable | None = None,
                 preprocess_logits_for_metrics: Callable | None = None, compute_loss_func: Callable | None = None,
                 optimizers: tuple[Any, Any] = (None, None), data_collator: Callable | None = None,
                 processing_class: Any = None, tokenizer: Any = None, model_init: Callable | None = None,
                 model: nn.Module | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None, **kwargs: Any) -> None:
        args, plugins, instances = fit_arguments(args, (accelerator, strategy, devices, num_nodes, precision),
                                              list(plugins or []), kwargs)
        self.args = args
        data_options(args)  # accelerator_config / split_batches: bad keys fail before any work
        if self.seed_on_init:  # models built after Fit(...) start from the seed (HF seeds in __init__ too)
            (enable_full_determinism if args.full_determinism else seed_everything)(args.seed)
        self.strategy = resolve_components(StrategyOptions.from_arguments(args), plugins, **instances)
        init_memory = None if args.skip_memory_metrics else MemoryTracker(self.strategy.root_device,
                                                                          self.strategy.accelerator)
        if init_memory is not None:  # the construction's own deltas, reported as init_mem_* (HF)
            init_memory.start()
        rank_zero_only.rank = self.strategy.global_rank  # one rank-zero gate for every side effect
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.compute_loss_func = compute_loss_func
        self._optimizers = optimizers
        self.processing_class = processing_class if processing_class is not None else tokenizer
        self.data_collator = default_collator(data_collator, self.processing_class)  # as HF: never None
        self.model_init = model_init
        self._given_model = model
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self.is_in_train = False  # True while fit() trains (HF's flag; evaluate() then runs inside that run)
        self._ignore_keys_for_eval: list[str] | None = None
        # the objects Fit owns: run launch and set-up, the stages' bodies, the HF override points
        self._launcher = RunLauncher(self)
        self._training = TrainingStage(self)
        self._stages = EvaluationStages(self)
        self._hf = HFAdapter(self, Fit)
        self._api = HFTrainerAPI(self)
        self.callbacks: list[Any] = default_callbacks(args, callbacks)
        efficiency.check_run(self)  # tf32, compile/checkpointing options, label smoothing, NEFTune
        self.loggers: list[Logger] = build_loggers(args, loggers)
        self._idle_state = FitState(is_local_process_zero=self.strategy.local_rank == 0,
                                    is_world_process_zero=self.strategy.is_global_zero)
        self._idle_control = FitControl()
        self._run: Run | None = None       # the run of the latest stage call (see taskfit.fit.run; public: .run)
        self._last_fit: Run | None = None  # the run of the latest fit()
        self.callback_metrics: dict[str, Any] = {}
        self.sanity_checking = False  # True while num_sanity_val_steps runs (Lightning's trainer.sanity_checking)
        self.logged_metrics: dict[str, Any] = {}
        self.num_eval_batches: int | None = None
        self._hooks = self._api.hook_runner()
        configure_console(args, self.strategy)  # log_level on main processes, log_level_replica elsewhere
        self._init_memory = None if init_memory is None else {
            **init_memory.stop("init"), "before_init_mem_cpu": init_memory.begin_cpu}
        self._hooks.call_hf("on_init_end", args, self.state, self.control)


    # ------------------------------------------------------------------------------- the current run ---
    @property
    def run(self) -> Run | None:
        """The run of the ``fit``/``validate``/``test``/``predict`` call in progress on this process (read-only;
        None outside a call): its model, module, optimizers, schedulers, loaders, state and the state a checkpoint
        saves (:class:`taskfit.fit.run.Run`). Callbacks read the run through it."""
        return self._run if self._launcher.depth else None

    @property
    def model(self) -> Any:
        """The model of the current or last run; before any, the constructor's ``model`` (None without one)."""
        return self._run.model if self._run is not None else self._given_model

    @property
    def module(self) -> Any:
        """The TaskModule the loops drive (the model itself, or the ``ModelTaskModule`` around a plain model)."""
        return self._run.module if self._run is not None else None

    @property
    def state(self) -> Any:
        """The loop state (HF ``TrainerState`` fields) of the current or last run."""
        return self._run.state if self._run is not None else self._idle_state

    @state.setter
    def state(self, value: Any) -> None:
        # HF lets a script replace trainer.state (e.g. with TrainerState.load_from_json(...))
        if self._run is not None:
            self._run.state = value
        else:
            self._idle_state = value

    @property
    def control(self) -> Any:
        """The control flags (HF ``TrainerControl``) of the current or last run."""
        return self._run.control if self._run is not None else self._idle_control

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers of the last ``fit`` (as the strategy returned them: DeepSpeed's own, ...)."""
        return list(self._last_fit.optimizers) if self._last_fit is not None else []

    @property
    def optimizer(self) -> Any:
        """The optimizer (HF ``Trainer.optimizer``): while a ``train()`` builds its optimizer, the one being built
        (None until ``create_optimizer`` sets it); after, the last ``fit``'s; before any, ``optimizers[0]`` given
        to the constructor. Settable, as in HF: inside ``create_optimizer`` it is the run's optimizer, outside it
        the optimizer the next ``train()`` starts from."""
        return self._hf.optimizer()

    @optimizer.setter
    def optimizer(self, value: Any) -> None:
        self._hf.set_optimizer(value)

    @property
    def lr_scheduler(self) -> Any:
        """The LR scheduler (HF ``Trainer.lr_scheduler``), with the same timing rules as :attr:`optimizer`."""
        return self._hf.lr_scheduler()

    @lr_scheduler.setter
    def lr_scheduler(self, value: Any) -> None:
        self._hf.set_lr_scheduler(value)

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The LR schedulers of the last ``fit`` with their step interval and monitor (Lightning's name)."""
        return list(self._last_fit.schedulers) if self._last_fit is not None else []

    @property
    def scheduler_interval(self) -> str:
        """When the first scheduler steps: ``"step"``, ``"epoch"`` or ``"eval"``."""
        configs = self.lr_scheduler_configs
        return configs[0].interval if configs else "step"

    @property
    def scheduler_monitor(self) -> str | None:
        """The metric the first (metric) scheduler watches, if any."""
        configs = self.lr_scheduler_configs
        return configs[0].monitor if configs else None

    @property
    def train_loader(self) -> Any:
        """The training DataLoader of the last ``fit`` (this process's share)."""
        return self._last_fit.train_loader if self._last_fit is not None else None

    @property
    def should_stop(self) -> bool:
        """Lightning alias of ``control.should_training_stop`` (settable)."""
        return self.control.should_training_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.control.should_training_stop = bool(value)

    def is_world_process_zero(self) -> bool:
        """HF alias of :attr:`is_global_zero`."""
        return self.strategy.is_global_zero

    def is_local_process_zero(self) -> bool:
        """True on the first process of each machine."""
        return self.strategy.local_rank == 0

    # ------------- HF Trainer members besides the stages (bodies and documentation in taskfit.fit.hf_members) ---
    callback_handler = property(hf_members.callback_handler)
    add_callback = hf_members.add_callback
    pop_callback = hf_members.pop_callback
    remove_callback = hf_members.remove_callback
    model_wrapped = property(hf_members.model_wrapped)
    get_num_trainable_parameters = hf_members.get_num_trainable_parameters
    get_learning_rates = hf_members.get_learning_rates
    get_optimizer_group = hf_members.get_optimizer_group
    get_decay_parameter_names = hf_members.get_decay_parameter_names
    compute_loss = hf_members.compute_loss
    floating_point_ops = hf_members.floating_point_ops
    create_optimizer_and_scheduler = hf_members.create_optimizer_and_scheduler
    create_optimizer = hf_members.create_optimizer
    create_scheduler = hf_members.create_scheduler
    get_train_dataloader = hf_members.get_train_dataloader
    get_eval_dataloader = hf_members.get_eval_dataloader
    get_test_dataloader = hf_members.get_test_dataloader
    training_step = hf_members.training_step
    prediction_step = hf_members.prediction_step
    _prepare_inputs = hf_members._prepare_inputs
    num_examples = staticmethod(num_examples)
    num_tokens = staticmethod(num_tokens)
    save_model = hf_members.save_model
    log_metrics = hf_members.log_metrics
    save_metrics = hf_members.save_metrics
    save_state = hf_members.save_state
    create_model_card = hf_members.create_model_card
    push_to_hub = hf_members.push_to_hub

    # ----------------------------------------------------------------------------------------- fitting ---
    def fit(self, model: nn.Module | None = None, train_data: Any = None, eval_data: Any = None, *,
            data_collator: Callable | None = None, datamodule: DataModule | None = None,
            resume_from_checkpoint: str | bool | None = None, weights_only: bool = True) -> TrainOutput:
        """Train ``model`` on ``train_data`` (a DataLoader, a Dataset, or ``datamodule``), evaluating on
        ``eval_data`` (one dataset/loader or a dict of named ones) as ``eval_strategy`` says. Without ``model``,
        ``model_init()`` builds a fresh one (every call), else the last run's model continues.

        ``resume_from_checkpoint`` (default ``args.resume_from_checkpoint``): ``True``/``"last"``/``"auto"`` continues
        from the newest complete checkpoint in ``output_dir`` (from scratch when there is none), a path or URL from
        that checkpoint (a ``transformers.Trainer`` checkpoint folder too); nothing given means ``"auto"`` after an
        elastic restart (torchrun ``--max-restarts``, SLURM requeue); the run then ends exactly as one that never stopped (see :mod:`taskfit.checkpoint.resume`).
        ``weights_only=False`` allows checkpoint files that need full unpickling (only for trusted files).

        Returns:
            TrainOutput: ``train_runtime`` (s), ``train_samples_per_second``, ``train_steps_per_second``,
            ``total_flos`` (see :meth:`floating_point_ops`), ``train_loss``, ``epoch``; with ``load_best_model_at_end``
            also ``best_global_step``, ``best_metric``, ``best_model_checkpoint``.

        Raises:
            ValueError: no or empty training data; evaluation requested without eval data or step; more optimizers
                than the strategy supports.
            TypeError: data of the wrong type; a training_step returning something other than a loss.
            CheckpointError: the checkpoint to resume from is incomplete, corrupted or incompatible.
            UnsafeCheckpointError: a checkpoint file needs full unpickling and ``weights_only`` is True.
            CheckpointSaveError: a background (async) checkpoint save failed.
        """
        if datamodule is None:
            train_data = train_data if train_data is not None else self.train_dataset
            eval_data = eval_data if eval_data is not None else self.eval_dataset
        return self._launcher.launch("fit", model, dict(train_data=train_data, eval_data=eval_data,
                                                         data_collator=data_collator, datamodule=datamodule,
                                                         resume_from_checkpoint=resume_from_checkpoint,
                                                         weights_only=weights_only))

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """HF ``Trainer.train``: :meth:`fit` on the constructor's ``model`` (or a fresh ``model_init()``),
        ``train_dataset`` and ``eval_dataset``.

        Args:
            resume_from_checkpoint (str | bool | None): as in :meth:`fit`.
            trial (optuna.Trial | dict | None): hyperparameters of a search trial; a dict's entries (or an optuna
                trial's ``params``) are set on ``args`` for this training, as HF does.
            ignore_keys_for_eval (list[str] | None): output keys the evaluations during this training leave out of
                the predictions (given to ``evaluate``/``prediction_step`` as ``ignore_keys``).

        Raises:
            TypeError: an unknown keyword (HF raises the same for leftovers).
        """
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {', '.join(sorted(kwargs))}.")
        if trial is not None:
            params = trial if isinstance(trial, Mapping) else getattr(trial, "params", {})
            if params:
                self.args = self.args.replace(**dict(params))
        self._ignore_keys_for_eval = ignore_keys_for_eval
        return self.fit(resume_from_checkpoint=resume_from_checkpoint)


    # ------------------------------------------------------------------------------------- evaluation ---
    def validate(self, model: nn.Module | None = None, data: Any = None, *, data_collator: Callable | None = None,
                 datamodule: DataModule | None = None, metric_key_prefix: str = "eval",
                 ckpt_path: str | None = None, ignore_keys: list[str] | None = None) -> dict[str, float]:
        """Evaluate on ``data`` (default: the eval data given to ``fit``); returns metrics such as
        ``eval_loss``, logged names (``val_acc``), ``compute_metrics`` results, ``eval_runtime`` (s),
        ``eval_samples_per_second``. A dict of datasets gives ``{prefix}_{name}_{metric}`` keys. ``ckpt_path``
        (``"best"``, ``"last"`` or a checkpoint folder; Lightning's argument) loads those weights first.
        ``ignore_keys``: output keys of a plain model left out of the predictions (HF's argument).

        Raises:
            ValueError: no data, empty data, a module without ``validation_step``, or no checkpoint for
                ``ckpt_path``.
        """
        model, data, ignore_keys = _hf_positional(model, data, ignore_keys)  # HF-style fit.evaluate(eval_dataset)
        return self._launcher.launch("validate", model, dict(
            data=data, data_collator=data_collator, datamodule=datamodule, metric_key_prefix=metric_key_prefix,
            ckpt_path=ckpt_path, ignore_keys=ignore_keys))

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", *, model: Any = None, data: Any = None,
                 **kwargs: Any) -> dict[str, float]:
        """Evaluate and return the metrics (HF ``Trainer.evaluate(eval_dataset, ignore_keys, metric_key_prefix)``);
        outside training :meth:`validate` (``fit.evaluate(model, data)`` and its keywords work too); called while
        training (by the loop, a callback or an override) it evaluates inside that run, as HF's does. A subclass
        override is what the evaluations during training call (as HF's ``_maybe_log_save_evaluate``)."""
        if isinstance(eval_dataset, nn.Module):  # Fit-style evaluate(model, data)
            model, eval_dataset, ignore_keys = eval_dataset, ignore_keys if data is None else data, None
        data = data if data is not None else eval_dataset
        if self.is_in_train or self._stages.eval_in_progress:
            return self._stages.hf_evaluate(data, ignore_keys, metric_key_prefix)
        return self.validate(model, data, metric_key_prefix=metric_key_prefix, ignore_keys=ignore_keys, **kwargs)

    def test(self, model: nn.Module | None = None, data: Any = None, *, data_collator: Callable | None = None,
             datamodule: DataModule | None = None, metric_key_prefix: str = "test",
             ckpt_path: str | None = None) -> dict[str, float]:
        """Like :meth:`validate` with ``test_step`` and ``test_`` keys (``ckpt_path`` as there; Lightning's
        ``Trainer.test``).

        Raises:
            ValueError: no or empty data.
        """
        if model is not None and not isinstance(model, nn.Module) and data is None:
            model, data = None, model
        return self._launcher.launch("test", model, dict(data=data, data_collator=data_collator, datamodule=datamodule,
                                                         metric_key_prefix=metric_key_prefix, ckpt_path=ckpt_path))

    def predict(self, test_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                *, model: nn.Module | None = None, data: Any = None, data_collator: Callable | None = None,
                datamodule: DataModule | None = None, ckpt_path: str | None = None) -> PredictionOutput:
        """Run ``predict_step`` over ``data``; returns ``PredictionOutput(predictions, label_ids, metrics)``
        with numpy arrays concatenated over batches (mirrors HF ``Trainer.predict``; ``ckpt_path`` as in
        :meth:`validate`). HF's signature ``predict(test_dataset, ignore_keys, metric_key_prefix)``; Fit's
        ``predict(model, data)`` and ``model=``/``data=`` keywords work too. A plain model's
        run builds its loader with :meth:`get_test_dataloader` and applies ``preprocess_logits_for_metrics``, as HF.

        Raises:
            ValueError: no or empty data.
        """
        if isinstance(test_dataset, nn.Module):  # Fit-style predict(model, data)
            model, test_dataset, ignore_keys = test_dataset, ignore_keys if data is None else data, None
        data = data if data is not None else test_dataset
        return self._launcher.launch("predict", model, dict(
            data=data, data_collator=data_collator, datamodule=datamodule, metric_key_prefix=metric_key_prefix,
            ckpt_path=ckpt_path, ignore_keys=ignore_keys))

    def save_checkpoint(self, filepath: str | None = None) -> str:
        """Write a checkpoint of the training run in progress (or, after it, of the last ``fit``) to the folder
        ``filepath`` (mirrors Lightning's ``Trainer.save_checkpoint``; ``ModelCheckpoint`` calls it); without
        ``filepath`` to ``output_dir/checkpoint-{global_step}`` as the run's own saves do (HF's folder, recorded as
        the best checkpoint and pushed with ``push_to_hub``). Every process must call it (the strategy gathers the
        shards and writes the manifest last). Returns the folder's path.

        Raises:
            RuntimeError: no ``fit`` ran yet (there is no training state to save).
        """
        run = self._run if self._run is not None and self._run.training_state is not None else self._last_fit
        if run is None or run.training_state is None:
            raise RuntimeError("save_checkpoint() needs a training run: call it during or after fit().")
        return self._training.write_checkpoint(run.training_state.state_dict(), filepath, run)

    def log(self, logs: dict[str, Any], start_time: float | None = None) -> None:
        """Send ``logs`` to every logger and ``on_log`` callbacks; append to ``state.log_history`` with the
        current ``step`` (and ``epoch`` unless given; ``num_input_tokens_seen`` with ``include_num_input_tokens_seen``). Mirrors HF ``Trainer.log`` (``start_time`` is accepted for
        its signature). The end-of-run summary (the row with ``train_runtime``, as HF's printer tells it apart)
        goes to the loggers' summary, apart from the per-step names."""
        summary = "train_runtime" in logs
        st = self.state
        logs.setdefault("epoch", st.epoch)  # unrounded, as HF 5
        if self.args.include_num_input_tokens_seen != "no":  # HF 5 puts the count into every row
            logs["num_input_tokens_seen"] = st.num_input_tokens_seen
        st.log_history.append({**logs, "step": st.global_step})
        self.logged_metrics.update(logs)
        self.callback_metrics.update(logs)
        if self.is_global_zero and not self.args.fast_dev_run:  # fast_dev_run: no loggers (Lightning)
            if summary:
                send_summary(self.loggers, logs, st.global_step)
            for lg in self.loggers if not summary else ():
                lg.log_metrics(logs, st.global_step)
        if self._hooks.hf["on_log"]:
            self._hooks.call_hf("on_log", self.args, st, self.control, logs=logs)

    def hyperparameter_search(self, hp_space: Callable | None = None, compute_objective: Callable | None = None,
                              n_trials: int = 20, direction: Any = "minimize", **kw: Any) -> Any:
        """Optuna search returning ``BestRun`` (F-HPO-1, HF ``Trainer.hyperparameter_search``); arguments
        (``backend``, ``train_data``, ``model_init``...): :func:`taskfit.fit.hpo.hyperparameter_search`."""
        runs = self._run, self._last_fit  # every trial is a run of its own; afterwards the Fit is as before
        try:
            return hyperparameter_search(self, hp_space, compute_objective, n_trials, direction, **kw)
        finally:
            self._run, self._last_fit = runs

    # ------------------------------------------------------ private members the loops and tests use ---
    def _loader(self, data: Any, *, train: bool, collator: Callable | None, what: str, run: Run | None = None) -> Any:
        return self._launcher.loader(data, train=train, collator=collator, what=what, run=run)

    def _eval_entry(self, model: Any, data: Any, stage: str, ckpt_path: str | None = None) -> Any:
        return self._stages.eval_entry(model, data, stage, ckpt_path)

    def _run_eval(self, loaders: dict[Any, Any], stage: str, prefix: str,
                  ignore_keys: list[str] | None = None) -> tuple[dict, set[str]]:
        return self._stages.run_eval(loaders, stage, prefix, ignore_keys)

    def _hf_prediction_step(self, run: Run, stage: str, ignore_keys: list[str] | None) -> Any:
        return self._hf.hf_prediction_step(run, stage, ignore_keys)
