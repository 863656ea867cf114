"""The Lightning door's order of the loaders in ``fit`` (``LoopPolicy.loaders_after_setup``): the validation loader
asked for inside the sanity check, the train loader after it (or when ``trainer.estimated_stepping_batches`` is read
in ``configure_optimizers``), so the step plan is made after the optimizers, as Lightning's ``Trainer.fit`` does;
``Fit`` builds its loaders and plan first (HF's order). Functions of :class:`taskfit.fit.training.TrainingStage`;
also the loaders built again for ``reload_dataloaders_every_n_epochs`` (both doors)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from taskfit.arguments.fit_arguments import FitArguments
from taskfit.core.hooks import module_loader
from taskfit.core.step_call import step_disabled
from taskfit.data.loaders import DataModule
from taskfit.fit.run import Run
from taskfit.optim.configure import _user_defined


def rebuild_train_loader(fit: Any, run: Run, datamodule: DataModule | None, module: Any, given: Any,
                         data_collator: Callable | None) -> Any:
    """A new train loader from the run's source, built as ``_new_run`` builds it: the datamodule's or the module's
    ``train_dataloader`` called again, given data reused (Lightning's ``reload_dataloaders_every_n_epochs``)."""
    if given is not None:
        data = given
    else:
        data = datamodule.train_dataloader() if datamodule is not None else module_loader(module, "train_dataloader")
    return fit._hf.train_dataloader(run, data, data_collator)


def rebuild_eval_loaders(fit: Any, run: Run, datamodule: DataModule | None, module: Any,
                         data_collator: Callable | None) -> None:
    """New eval loaders for ``run`` from the datamodule's or the module's ``val_dataloader`` called again, built as
    ``_new_run`` builds them, at ``run.state.current_epoch`` (Lightning's ``reload_dataloaders_every_n_epochs``
    for the validation loaders; given eval data is never reloaded)."""
    data = datamodule.val_dataloader() if datamodule is not None else module_loader(module, "val_dataloader")
    run.eval_data = data
    run.eval_loaders = fit._launcher.eval_loader_dict(data, data_collator, run=run)
    run.eval_loaded_epoch = run.state.current_epoch


def given_value(value: Any) -> Any:
    """``value`` itself (a picklable constant callable, with ``functools.partial``)."""
    return value


def loaders_late(fit: Any, module: Any) -> bool:
    """Whether this run asks for its loaders where Lightning does (``LoopPolicy.loaders_after_setup``): not
    when the set-up needs the step plan (an engine that owns the step, such as DeepSpeed's schedule, an
    optimizer built by the backend, given with ``optimizers=``, or the default one with its schedule), nor with
    a finder callback (``BatchSizeFinder``, ``LearningRateFinder``: they search on the train loader at
    ``on_fit_start``, and Lightning builds it for them there too)."""
    return bool(fit.loop_policy.loaders_after_setup and not fit.strategy.engine_owns_step
                and not fit.strategy.builds_own_optimizer and fit._optimizers[0] is None
                and fit.optimizer_cls_and_kwargs is None and _user_defined(module, "configure_optimizers")
                and not any(getattr(cb, "runs_first", False) for cb in fit.callbacks))


def late_run(stage: Any, args: FitArguments, model: nn.Module, module: Any, datamodule: DataModule | None,
             data: tuple[Any, Any, Callable | None], resume: str | bool | None,
             weights_only: bool) -> tuple[Run, str | None]:
    """The run without loaders (Lightning's order) and the checkpoint it resumes from; its
    ``build_eval_loaders`` / ``build_plan`` ask for the loaders when needed. What can be checked without the
    loaders is checked now, before any work.

    Raises:
        ValueError: no source of training data; eval data for a module without ``validation_step``; manual
            optimization with accumulation.
    """
    fit = stage.fit
    train_data, eval_data, collator = data
    own_loader = _user_defined(module, "train_dataloader") or "train_dataloader" in vars(module)
    if train_data is None and datamodule is None and not own_loader:
        raise ValueError("fit() needs training data: pass train_data (DataLoader or Dataset) or a datamodule.")
    can_validate = (not step_disabled(module, "validation_step") if datamodule is not None
                    else fit._stages.can_validate(module))
    if eval_data is not None and not fit._stages.can_validate(module):
        raise ValueError(f"{type(module).__name__} has no validation_step, but eval data was given.")
    stage._check_manual(args, module)
    run = stage._new_run(args, model, module, None, None, collator)
    if can_validate and args.limit_val_batches != 0:
        run.build_eval_loaders = functools.partial(_late_eval_loaders, stage, run, args, datamodule, eval_data,
                                                   collator)
    ckpt = stage._checkpoint(args, resume)
    run.build_plan = functools.partial(_late_plan, stage, run, args, datamodule, train_data, collator, ckpt,
                                       weights_only)
    return run, ckpt


def _late_eval_loaders(stage: Any, run: Run, args: FitArguments, datamodule: DataModule | None, eval_data: Any,
                       collator: Callable | None) -> None:
    """Build the run's eval loaders once (given data, else the datamodule's or the module's
    ``val_dataloader``). Raises ValueError when ``eval_strategy`` wants evaluation and there is no data."""
    fit, module = stage.fit, run.module
    run.build_eval_loaders = None
    given = eval_data is not None
    if eval_data is None:
        eval_data = datamodule.val_dataloader() if datamodule is not None else module_loader(
            module, "val_dataloader")
    if args.eval_strategy != "no" and eval_data is None:
        raise ValueError(f"eval_strategy={args.eval_strategy!r} needs eval data; pass eval_data or set "
                         "eval_strategy='no'.")
    run.eval_loaders = fit._launcher.eval_loader_dict(eval_data, collator, run=run)
    run.eval_data = eval_data
    if run.eval_loaders and not given:
        run.reload_eval_loaders = functools.partial(rebuild_eval_loaders, fit, run, datamodule, module, collator)


def _late_plan(stage: Any, run: Run, args: FitArguments, datamodule: DataModule | None, train_data: Any,
               collator: Callable | None, ckpt: str | None, weights_only: bool) -> Any:
    """Build the train loader (given data, else ``train_dataloader``) and the step plan, once; later calls
    return the same plan (``estimated_stepping_batches`` read in ``configure_optimizers`` builds it early, as
    Lightning does). Raises ValueError when there is no training data."""
    fit, module = stage.fit, run.module
    given = train_data
    if train_data is None:
        train_data = datamodule.train_dataloader() if datamodule is not None else module_loader(
            module, "train_dataloader")
    if train_data is None:
        raise ValueError("fit() needs training data: pass train_data (DataLoader or Dataset) or a datamodule.")
    run.train_loader = fit._hf.train_dataloader(run, train_data, collator)
    run.reload_train_loader = functools.partial(rebuild_train_loader, fit, run, datamodule, module, given,
                                                collator)
    plan = stage._steps(run, args, ckpt, weights_only)
    run.build_plan = functools.partial(given_value, plan)
    return plan


def late_training_start(stage: Any, run: Run, args: FitArguments, ckpt: str | None, weights_only: bool) -> Any:
    """After the sanity check (Lightning's order): the train loader and the plan, the eval loaders when no
    sanity check asked for them, the rest of a resume (optimizers, schedulers, loop state), the run summary
    and HF's ``on_train_begin``. Returns the plan."""
    fit = stage.fit
    plan = run.build_plan()
    if run.build_eval_loaders is not None:
        run.build_eval_loaders()
    if ckpt:
        stage._restore(run, args, plan, ckpt, weights_only, callbacks_restored=True)
        run.control._new_training()  # a checkpoint saved as training ended must not stop this one
    stage._before_training(run, plan)
    fit._hooks.call_hf("on_train_begin", args, run.state, run.control, **run.hf_kwargs())
    return plan

