"""The loop semantics where Lightning's ``Trainer`` and HF's ``Trainer`` differ, as one object chosen once before
the loop (:class:`LoopPolicy`): ``Fit`` holds HF's defaults, ``taskfit.lightning.Trainer`` Lightning's. The loops
read its fields; they never ask which door started the run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoopPolicy:
    """What the fit loop and the evaluation during ``fit`` do where Lightning and HF differ. The defaults are HF's
    (``Fit``); the Lightning door builds one from its ``Trainer`` flags.

    Attributes:
        counts_optimizer_steps (bool): under manual optimization ``global_step`` counts every optimizer's steps
            (Lightning: two optimizers -> 2 per batch; ``max_steps`` limits them) instead of one per batch (HF).
        min_epochs (int | None), min_steps (int | None): a stop request (``should_stop``, early stopping) waits
            until that many epochs are done and optimizer steps taken (Lightning's ``Trainer(min_epochs=,
            min_steps=)``, parsed: ``min_epochs`` 1 when only ``min_steps`` is given); None: no minimum (HF).
        reload_dataloaders_every_n_epochs (int): epochs between new train and validation loaders built again from
            their source (a datamodule's or the module's ``*_dataloader``; given loaders are reused), as
            Lightning's flag of that name; 0: never (HF).
        clip_algorithm_as_given (bool): ``configure_gradient_clipping`` receives ``gradient_clip_algorithm``
            below as given (Lightning: None when the flag was not given) instead of the algorithm in effect (HF
            has no such hook; ``Fit`` passes ``"norm"``/``"value"`` when clipping, else None).
        gradient_clip_algorithm (str | None): that flag, read only with ``clip_algorithm_as_given``.
        eval_prefix (str): the key prefix of an evaluation during ``fit`` (HF's ``metric_key_prefix="eval"``:
            ``eval_acc``); Lightning's ``""`` keeps the names logged with ``self.log``.
        validation_closes_epoch (bool): a checkpoint taken during an epoch's closing validation (a
            ``ModelCheckpoint`` saving after it) resumes at the next epoch's start, as Lightning (which then runs
            neither that validation, nor that epoch's ``on_train_epoch_end`` and plateau scheduler step again);
            False resumes at the epoch's end and validates again, so everything after the save runs once.
        checkpoint_callbacks_last (bool): checkpoint callbacks run after the others at every hook, finders first
            (Lightning's ``_reorder_callbacks``, also after a module's ``configure_callbacks``); False keeps the
            given order (HF calls callbacks in the order given; its own save follows them all anyway).
        model_callbacks_by_subclass (bool): a callback a module's ``configure_callbacks`` returns also replaces
            the trainer's callbacks of a class it subclasses, with Lightning's INFO line naming them (Lightning's
            ``_attach_model_callbacks``); False replaces only callbacks of exactly its class.
        keeps_submodule_modes (bool): a module already in training mode at the start of training keeps each
            submodule's mode (Lightning: a submodule frozen in eval mode stays there); False puts the whole model
            in training mode, as HF's ``model.train()`` (a PEFT model's base loaded by ``from_pretrained`` in eval
            mode included).
        none_optimizer_trains_nothing (bool): ``configure_optimizers`` returning None trains with no optimizer
            (Lightning, with its warning); False: ``Fit`` builds its default optimizer (HF's AdamW).
        max_epochs (int | None): training ends after this many epochs whatever the step plan says (Lightning's
            ``max_epochs``, checked before each epoch: 0 sets up, runs the sanity check and trains nothing; a
            resumed checkpoint saved in a later epoch is refused, as Lightning); None: the plan's epochs (HF:
            ``num_train_epochs`` > 0, or what ``max_steps`` needs).
        plateau_steps_after_validation (bool): a ``ReduceLROnPlateau`` of interval ``"step"`` steps after the
            validation that follows its batch (so it may monitor a validation value, and a checkpoint saved by that
            validation holds it one step behind), as Lightning's ``update_plateau_schedulers=True`` pass; False
            steps it with the batch's other step schedulers, before any validation.
        closure_in_optimizer_step (bool): under automatic optimization the window's last closure (training_step,
            zero_grad, backward, then the ``on_before_optimizer_step`` hooks and clipping) runs inside
            ``optimizer.step(closure=...)`` (Lightning's ``Precision.optimizer_step``); False runs it, then calls
            ``optimizer.step()`` (HF). An optimizer whose ``step`` requires a closure (``LBFGS``) gets it either way.
        none_loss_skips_batch (bool): ``training_step`` returning None under automatic optimization skips the
            batch's backward (Lightning, with its warning; the zero_grad and the optimizer step still run, so the
            unchanged gradients leave the weights as they are); False raises TypeError (HF's ``Trainer`` cannot
            backpropagate a missing loss either).
        lightning_checkpoint_dict (bool): ``on_save_checkpoint``/``on_load_checkpoint`` receive a dict of
            Lightning's shape (``epoch``, ``global_step``, ``state_dict``, ``optimizer_states``, ``lr_schedulers``,
            ``callbacks``, ...; keys a hook adds are saved and given back at load) instead of the training-state
            dict (``Fit``: the dict ``training_state.pt`` holds, with Lightning's ``epoch``/``global_step``/
            ``lr_schedulers`` added for reading).
        loaders_after_setup (bool): the loaders are asked for where Lightning asks: the validation loader inside
            the sanity check, the train loader after it (or when ``estimated_stepping_batches`` is read), so the
            step plan is made after ``configure_optimizers``; a resume restores the weights, calls
            ``on_load_checkpoint`` and the callbacks' ``load_state_dict`` before ``configure_optimizers``. False
            (HF): the loaders first, the plan from their lengths, then the optimizers and the restore. Runs whose
            set-up needs the plan (DeepSpeed, the default optimizer and schedule) keep HF's order.
        resumed_epoch_skips_start (bool): a resume that continues an epoch mid-way does not call
            ``on_train_epoch_start`` again (Lightning: once per epoch); False calls it for the resumed epoch too
            (``Fit``, as HF calls ``on_epoch_begin`` for it). Also, with ``validation_closes_epoch``, a checkpoint
            taken at the end of an epoch cut short by ``max_steps`` continues that epoch (Lightning).
        zero_grad_before_validation (bool): every validation during ``fit`` starts with the module's
            ``on_validation_model_zero_grad`` (Lightning: its default ``zero_grad()`` frees the gradients' memory);
            False calls it only when the module overrides it (``Fit``: HF keeps the gradients).
        eval_inference_mode (bool): ``validate``, ``test`` and ``predict`` (their start hooks included) run under
            ``torch.inference_mode()`` (Lightning's ``Trainer(inference_mode=True)``, its default; not with sharded
            parameters or a gloo process group), else under ``torch.no_grad()`` (HF); the validation inside
            ``fit`` always runs under ``no_grad`` (Lightning too).
        sanity_check_keeps_rng (bool): the sanity check, with the ``val_dataloader()`` call made for it, leaves
            the random generators as it found them (Lightning's ``isolate_rng``: training draws the same numbers
            with or without it; a ``train_dataloader()`` built from random data after it draws what the
            validation loader drew); False: they run on (``Fit``).
        logs_run_values (bool): log rows, ``logged_metrics`` and ``callback_metrics`` also hold the run's own values
            (the mean ``loss`` since the last row, ``learning_rate``, ``grad_norm``, the precision plugin's values,
            an evaluation's speed and timing rows), as HF's log rows, and the loggers' hyperparameters hold the
            run's arguments too; False: only what ``self.log`` wrote (Lightning's ``logged_metrics``/
            ``callback_metrics``), and the loop logs no hyperparameters (the Lightning door gives the loggers the
            module's and datamodule's values saved with ``logger=True`` as each trainer method starts, as
            Lightning's ``_log_hyperparams``).
        reads_eval_outputs (bool): what ``validation_step``/``test_step`` return is read for the evaluation's
            loss, predictions and labels (HF's ``prediction_step`` outputs; anything else is refused); False: it is
            only handed to the ``on_*_batch_end`` hooks, whatever it is (Lightning).
        log_hooks (Mapping | None): the hooks in which ``self.log`` may be called, with the ``on_step``/``on_epoch``
            values each allows (Lightning's table: ``self.log`` in ``setup``, ``configure_optimizers``, checkpoint
            hooks... raises, as in a ``predict`` stage; :func:`taskfit.core.hook_logging.check_hook_log`). Set, the
            loops also run the step methods and the module's own ``backward``/``optimizer_step``/
            ``optimizer_zero_grad``/``configure_gradient_clipping`` as the running hook, ``self.log`` with no running
            hook is refused ("not managed by the `Trainer` control flow"), and so is one made when the owner's
            ``collects_logs`` is False (no trainer method running, or ``predict``). None: ``self.log`` works
            wherever a stage keeps values (``Fit``).
        metric_attribute_required (bool): ``self.log(name, metric)`` with a ``torchmetrics.Metric`` the module
            does not hold among its submodules (and no ``metric_attribute=``) is refused (Lightning restores a
            metric's state through that attribute); False: any Metric is taken, its state kept under ``name``.
        stop_checked_before_epoch (bool): a stop request already made when an epoch would start (``should_stop``
            set in ``on_fit_start``, e.g. by a ``Timer`` whose budget is spent) ends training before it, so no step
            runs (Lightning's ``fit_loop.done``); False: the request is read after the next step (HF).
        stage_argument (Callable[[str], Any]): what ``setup(stage)``/``teardown(stage)`` of the datamodule, the
            callbacks and the module receive for the stage name (``"fit"``): ``str`` gives the name itself
            (``Fit``); Lightning's door gives its ``TrainerFn`` member (a str Enum equal to the name).
        distributed_sampler (str): how several processes share a loader: ``"split"``, each reads its strided share
            of the given order (``Fit``); ``"lightning"``, the training loader gets a ``DistributedSampler`` that
            shuffles with ``seed + epoch`` (``PL_GLOBAL_SEED`` or 0) whatever the given loader did, an evaluation
            loader one that shuffles only when the given one did (Lightning's ``_process_dataloader``;
            :func:`taskfit.data.shuffled_split.shuffled_split_loader`); ``"as_given"``, every process reads the
            loaders as given (Lightning's ``use_distributed_sampler=False``).
    """

    counts_optimizer_steps: bool = False
    min_epochs: int | None = None
    min_steps: int | None = None
    reload_dataloaders_every_n_epochs: int = 0
    clip_algorithm_as_given: bool = False
    gradient_clip_algorithm: str | None = None
    eval_prefix: str = "eval"
    validation_closes_epoch: bool = False
    checkpoint_callbacks_last: bool = False
    model_callbacks_by_subclass: bool = False
    keeps_submodule_modes: bool = False
    none_optimizer_trains_nothing: bool = False
    max_epochs: int | None = None
    plateau_steps_after_validation: bool = False
    closure_in_optimizer_step: bool = False
    none_loss_skips_batch: bool = False
    lightning_checkpoint_dict: bool = False
    loaders_after_setup: bool = False
    resumed_epoch_skips_start: bool = False
    zero_grad_before_validation: bool = False
    eval_inference_mode: bool = False
    sanity_check_keeps_rng: bool = False
    logs_run_values: bool = True
    reads_eval_outputs: bool = True
    log_hooks: Mapping[str, Any] | None = None
    metric_attribute_required: bool = False
    stop_checked_before_epoch: bool = False
    stage_argument: Callable[[str], Any] = str
    distributed_sampler: str = "split"

    def clip_algorithm_argument(self, max_norm: float | None, by_value: bool) -> str | None:
        """What ``configure_gradient_clipping`` receives as its algorithm, given the clipping in effect
        (``max_norm`` > 0 clips; ``by_value`` clips by value)."""
        if self.clip_algorithm_as_given:
            return self.gradient_clip_algorithm
        return ("value" if by_value else "norm") if max_norm and max_norm > 0 else None

    def reload_due(self, epoch: int, last_reload: int) -> bool:
        """Whether loaders built at epoch ``last_reload`` are built again at ``epoch`` (Lightning's
        ``_should_reload_train_dl`` / ``_should_reload_val_dl``)."""
        every = self.reload_dataloaders_every_n_epochs
        return bool(every) and epoch - last_reload >= every
