"""The loop semantics where Lightning's ``Trainer`` and HF's ``Trainer`` differ, as one object chosen once before
the loop (:class:`LoopPolicy`): ``Fit`` holds HF's defaults, ``taskfit.lightning.Trainer`` Lightning's. The loops
read its fields; they never ask which door started the run."""

from __future__ import annotations

from dataclasses import dataclass


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
        keeps_submodule_modes (bool): a module already in training mode at the start of training keeps each
            submodule's mode (Lightning: a submodule frozen in eval mode stays there); False puts the whole model
            in training mode, as HF's ``model.train()`` (a PEFT model's base loaded by ``from_pretrained`` in eval
            mode included).
        none_optimizer_trains_nothing (bool): ``configure_optimizers`` returning None trains with no optimizer
            (Lightning, with its warning); False: ``Fit`` builds its default optimizer (HF's AdamW).
        logs_run_values (bool): log rows, ``logged_metrics`` and ``callback_metrics`` also hold the run's own values
            (the mean ``loss`` since the last row, ``learning_rate``, ``grad_norm``, the precision plugin's values,
            an evaluation's speed and timing rows), as HF's log rows; False: only what ``self.log`` wrote
            (Lightning's ``logged_metrics``/``callback_metrics``).
        reads_eval_outputs (bool): what ``validation_step``/``test_step`` return is read for the evaluation's
            loss, predictions and labels (HF's ``prediction_step`` outputs; anything else is refused); False: it is
            only handed to the ``on_*_batch_end`` hooks, whatever it is (Lightning).
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
    keeps_submodule_modes: bool = False
    none_optimizer_trains_nothing: bool = False
    logs_run_values: bool = True
    reads_eval_outputs: bool = True

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
