"""F-LOOP-6: callbacks, their documented hook order, control flags, add/pop/remove, HF ``TrainerCallback``
compatibility and ``EarlyStopping``.

The expected hook sequence below is written out by hand from the order documented in the module docstring of
``taskfit.callbacks.base``; the test fails when the loop calls hooks in any other order.
"""

from __future__ import annotations

import pytest
import torch
from helpers.models import Regression, regression_data
from taskfit import (
    Callback,
    EarlyStopping,
    EarlyStoppingCallback,
    Fit,
    FitArguments,
    FitControl,
    FitState,
    TaskModule,
)
from taskfit.callbacks.base import HF_HOOKS, LIGHTNING_HOOKS, HookRunner
from taskfit.core.module import MODULE_HOOKS
from torch.utils.data import TensorDataset


# ------------------------------------------------------------------------------------------------ helpers ---
def _data(n: int, seed: int = 0) -> TensorDataset:
    return regression_data(n, seed=seed)


def _fit(tmp_path, **kwargs) -> Fit:
    opts = {"output_dir": str(tmp_path), "disable_tqdm": True, "report_to": "none", "save_strategy": "no",
            "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2}
    opts.update(kwargs)
    return Fit(**opts)


# ------------------------------------------------------------------------------------------- hook order ---
CALLS: list[tuple[str, object]] = []


def _lightning(name):
    if name in ("setup", "teardown"):
        def hook(self, fit, module, stage):
            assert isinstance(fit, Fit) and isinstance(module, TaskModule)
            CALLS.append((f"cb.{name}", stage))
    else:
        def hook(self, fit, module, *args):
            assert isinstance(fit, Fit) and isinstance(module, TaskModule)
            CALLS.append((f"cb.{name}", fit.state.global_step))
    return hook


def _hf(name):
    def hook(self, args, state, control, **kwargs):
        assert isinstance(args, FitArguments) and isinstance(state, FitState) and isinstance(control, FitControl)
        CALLS.append((f"hf.{name}", state.global_step))
    return hook


def _module_hook(name):
    def hook(self, *args, **kwargs):  # setup/teardown get stage= by keyword (as Lightning passes it)
        CALLS.append((f"mod.{name}", self.fit.state.global_step))
    return hook


class RecordingCallback(Callback):
    """Overrides every Lightning-style and HF-style hook (``on_train_end`` in Lightning style)."""


for _n in LIGHTNING_HOOKS:
    setattr(RecordingCallback, _n, _lightning(_n))
for _n in HF_HOOKS:
    setattr(RecordingCallback, _n, _hf(_n))


class HFTrainEnd(Callback):
    def on_train_end(self, args, state, control, **kwargs):
        CALLS.append(("hf.on_train_end", state.global_step))


class RecordingModule(Regression):
    def training_step(self, batch, batch_idx):
        CALLS.append(("mod.training_step", batch_idx))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        CALLS.append(("mod.validation_step", batch_idx))
        return super().validation_step(batch, batch_idx)


for _n in MODULE_HOOKS:
    setattr(RecordingModule, _n, _module_hook(_n))


def _L(name, step):
    out = [(f"cb.{name}", step)]
    if name in MODULE_HOOKS:
        out.append((f"mod.{name}", step))
    return out


def _H(name, step):
    return [(f"hf.{name}", step)]


def _window(first_idx: int, step: int) -> list:
    """Two micro-batches (accumulation 2) of the optimizer step that takes global_step from ``step`` to ``step+1``."""
    seq = []
    seq += _L("on_train_batch_start", step) + _H("on_step_begin", step) + [("mod.training_step", first_idx)]
    seq += _L("on_before_zero_grad", step)  # Lightning: after the window's first training_step, before backward
    seq += _L("on_before_backward", step) + _L("on_after_backward", step)
    seq += _H("on_substep_end", step) + _L("on_train_batch_end", step)
    seq += _L("on_train_batch_start", step) + [("mod.training_step", first_idx + 1)]
    seq += _L("on_before_backward", step) + _L("on_after_backward", step)
    seq += _L("on_before_optimizer_step", step) + _H("on_pre_optimizer_step", step) + _H("on_optimizer_step", step)
    seq += _L("on_train_batch_end", step + 1) + _H("on_step_end", step + 1)
    return seq


def test_hook_order_matches_documentation_F_LOOP_6(tmp_path):
    """F-LOOP-6: 4 micro-batches, accumulation 2 (2 optimizer steps), logging every step, evaluation and a
    checkpoint at step 2: the calls are exactly the documented order (callbacks before the module's hook)."""
    CALLS.clear()
    fit = _fit(tmp_path, gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1,
               eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
               callbacks=[RecordingCallback(), HFTrainEnd()])
    fit.fit(RecordingModule(), _data(8), _data(2, seed=1))

    validation = (_L("on_validation_start", 2) + _L("on_validation_epoch_start", 2)
                  + _L("on_validation_batch_start", 2) + [("mod.validation_step", 0)]
                  + _L("on_validation_batch_end", 2) + _H("on_prediction_step", 2)
                  + _L("on_validation_epoch_end", 2) + _L("on_validation_end", 2))
    expected = (
        _H("on_init_end", 0)
        + [("cb.setup", "fit"), ("mod.setup", 0)]
        + _L("on_fit_start", 0) + _H("on_train_begin", 0) + _L("on_train_start", 0)
        + _L("on_train_epoch_start", 0) + _H("on_epoch_begin", 0)
        + _window(0, 0) + _H("on_log", 1)
        + _window(2, 1) + _H("on_log", 2)
        + validation + _H("on_log", 2) + _H("on_evaluate", 2)
        + _L("on_save_checkpoint", 2) + _H("on_save", 2)
        + _H("on_epoch_end", 2) + _L("on_train_epoch_end", 2)
        + _H("on_log", 2)  # the final train metrics (train_runtime, ...)
        + _L("on_train_end", 2) + _H("on_train_end", 2)
        + _L("on_fit_end", 2)
        + [("cb.teardown", "fit"), ("mod.teardown", 2)]
    )
    assert CALLS == expected
    assert (tmp_path / "checkpoint-2").is_dir()


def test_hook_arguments_F_LOOP_6(tmp_path):
    """F-LOOP-6: batch hooks get the batch and its index in the epoch, on_before_backward the (weighted) loss,
    optimizer hooks the optimizer, on_train_batch_end the training_step output."""
    seen: dict[str, list] = {"start": [], "end": [], "loss": [], "opt": [], "out": []}

    class Args(Callback):
        def on_train_batch_start(self, fit, module, batch, batch_idx):
            seen["start"].append((batch_idx, tuple(batch[0].shape)))

        def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
            seen["end"].append(batch_idx)
            seen["out"].append(outputs)

        def on_before_backward(self, fit, module, loss):
            seen["loss"].append(loss)

        def on_before_optimizer_step(self, fit, module, optimizer):
            seen["opt"].append(optimizer)

    fit = _fit(tmp_path, gradient_accumulation_steps=2, num_train_epochs=1, callbacks=[Args()])
    fit.fit(Regression(), _data(8))
    assert seen["start"] == [(0, (2, 3)), (1, (2, 3)), (2, (2, 3)), (3, (2, 3))]
    assert seen["end"] == [0, 1, 2, 3]
    assert all(isinstance(l, torch.Tensor) and l.dim() == 0 and l.requires_grad for l in seen["loss"])
    # outputs is {"loss": the micro-batch loss scaled by its share of the window, detached} (Lightning)
    assert all(set(o) == {"loss"} and o["loss"].dim() == 0 and not o["loss"].requires_grad for o in seen["out"])
    for loss, out in zip(seen["loss"], seen["out"]):
        assert torch.equal(loss.detach(), out["loss"])
    assert seen["opt"] == [fit.optimizer, fit.optimizer]


def test_on_train_end_both_styles_get_their_arguments_F_LOOP_6(tmp_path):
    """F-LOOP-6: ``on_train_end(self, fit, module)`` and ``on_train_end(self, args, state, control, **kwargs)``
    are told apart by their first parameter and both are called with the right objects."""
    got = {}

    class LightningStyle(Callback):
        def on_train_end(self, fit, module):
            got["lightning"] = (fit, module, fit.state.global_step)

    class HFStyle(Callback):
        def on_train_end(self, args, state, control, **kwargs):
            got["hf"] = (args, state, control, kwargs)

    fit = _fit(tmp_path, max_steps=3, callbacks=[LightningStyle(), HFStyle()])
    module = Regression()
    fit.fit(module, _data(8))
    f, m, step = got["lightning"]
    assert f is fit and m is module and step == 3
    args, state, control, kwargs = got["hf"]
    assert args is fit.args and state is fit.state and control is fit.control
    assert state.global_step == 3
    assert kwargs["model"] is module and kwargs["optimizer"] is fit.optimizer
    assert kwargs["lr_scheduler"] is fit.lr_scheduler and kwargs["train_dataloader"] is fit.train_loader
    runner = fit._hooks
    assert [fn.__self__ for fn, _ in runner.lightning["on_train_end"]] == [fit.callbacks[0]]
    assert [fn.__self__ for fn in runner.hf["on_train_end"]] == [fit.callbacks[1]]


# ---------------------------------------------------------------------------------------- control flags ---
class CountSteps(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.micro_batches = 0

    def training_step(self, batch, batch_idx):
        self.micro_batches += 1
        return super().training_step(batch, batch_idx)


def test_should_training_stop_from_on_step_end_stops_at_that_step_F_LOOP_6(tmp_path):
    """F-LOOP-6: ``control.should_training_stop = True`` in ``on_step_end`` at step 3 ends training at step 3."""

    class StopAt3(Callback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_training_stop = True

    module = CountSteps()
    fit = _fit(tmp_path, max_steps=10, gradient_accumulation_steps=2, callbacks=[StopAt3()])
    out = fit.fit(module, _data(40))
    assert out.global_step == 3 and fit.state.global_step == 3
    assert module.micro_batches == 6


def test_returned_control_object_is_honoured_F_LOOP_6(tmp_path):
    """F-LOOP-6: an HF-style hook may return a control object; its flags are copied into the run's control."""

    class ReturnNew(Callback):
        def on_step_end(self, args, state, control, **kwargs):
            return FitControl(should_training_stop=state.global_step == 2)

    fit = _fit(tmp_path, max_steps=10, callbacks=[ReturnNew()])
    assert fit.fit(Regression(), _data(40)).global_step == 2


def test_should_stop_from_lightning_hook_F_LOOP_6(tmp_path):
    """F-LOOP-6: ``fit.should_stop = True`` from ``on_train_batch_end`` stops after that optimizer step; from
    ``on_train_epoch_end`` it stops after that epoch."""

    class StopBatch(Callback):
        def on_train_batch_end(self, fit, module, outputs, batch, batch_idx):
            if fit.state.global_step == 4:
                fit.should_stop = True

    module = CountSteps()
    fit = _fit(tmp_path, max_steps=20, callbacks=[StopBatch()])
    assert fit.fit(module, _data(80)).global_step == 4
    assert module.micro_batches == 4 and fit.should_stop is True

    class StopEpoch(Callback):
        def on_train_epoch_end(self, fit, module):
            fit.should_stop = True

    module = CountSteps()
    fit = _fit(tmp_path, num_train_epochs=5, callbacks=[StopEpoch()])
    fit.fit(module, _data(6))  # 3 steps per epoch
    assert fit.state.global_step == 3 and module.micro_batches == 3


def test_should_stop_from_module_hook_F_LOOP_6(tmp_path):
    """F-LOOP-6: a TaskModule hook can stop training through ``self.fit.should_stop``."""

    class Stopper(CountSteps):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.global_step == 2:
                self.fit.should_stop = True

    module = Stopper()
    assert _fit(tmp_path, max_steps=10).fit(module, _data(40)).global_step == 2
    assert module.micro_batches == 2


# ----------------------------------------------------------------------------------- add / pop / remove ---
class OnlyLog(Callback):
    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def test_add_pop_remove_callback_F_LOOP_6(tmp_path):
    """F-LOOP-6: ``add_callback`` (instance or class), ``pop_callback`` returns the removed instance,
    ``remove_callback`` removes by class or instance; the hook lists follow."""
    fit = _fit(tmp_path, max_steps=2, logging_steps=1)
    from taskfit.callbacks.console import LogPrinter

    assert [type(c) for c in fit.callbacks] == [LogPrinter]  # the default console view (HF's PrinterCallback)
    assert isinstance(fit.pop_callback(LogPrinter), LogPrinter) and fit.callbacks == []
    fit.add_callback(OnlyLog)
    assert isinstance(fit.callbacks[0], OnlyLog)
    second = OnlyLog()
    fit.add_callback(second)
    assert len(fit._hooks.hf["on_log"]) == 2
    popped = fit.pop_callback(OnlyLog)
    assert isinstance(popped, OnlyLog) and popped is not second
    assert fit.callbacks == [second]
    assert fit.pop_callback(EarlyStopping) is None
    fit.fit(Regression(), _data(8))
    assert [l["loss"] for l in second.logs if "loss" in l] and not popped.logs
    fit.remove_callback(second)
    assert fit.callbacks == [] and fit._hooks.hf["on_log"] == []
    fit.add_callback(second)
    fit.remove_callback(OnlyLog)
    assert fit.callbacks == []


def test_hook_lists_hold_only_overriding_callbacks_F_LOOP_6():
    """F-LOOP-6 / DESIGN hot path: a callback that does not override a hook is not in that hook's list."""
    cb = OnlyLog()
    runner = HookRunner([cb])
    assert [fn.__self__ for fn in runner.hf["on_log"]] == [cb]
    assert all(not fns for name, fns in runner.hf.items() if name != "on_log")
    assert all(not fns for fns in runner.lightning.values())
    # EarlyStopping listens once per run (start/end), once per epoch (check_on_train_epoch_end) and to
    # on_evaluate: nothing on the per-step path (its epoch-end check runs after the module's own hook)
    es_runner = HookRunner([Callback(), EarlyStopping()])
    assert {k for k, fns in es_runner.lightning.items() if fns} == {"on_train_start", "on_train_end",
                                                                     "on_train_epoch_end:monitoring"}
    es_runner = HookRunner([EarlyStopping()])
    assert [name for name, fns in es_runner.hf.items() if fns] == ["on_evaluate"]

    class ModuleWithOneHook(Regression):
        def on_train_epoch_start(self):
            pass

    module = ModuleWithOneHook()
    runner = HookRunner([cb], module)
    assert [name for name, fns in runner.lightning.items() if fns] == ["on_train_epoch_start"]
    assert runner.lightning["on_train_epoch_start"][0][1] is False  # the module's own hook


def test_transformers_trainer_callback_works_F_LOOP_6(tmp_path):
    """F-LOOP-6: a ``transformers.TrainerCallback`` subclass instance is a callback: ``on_log`` receives the
    logs, ``on_step_end`` can stop training, the non-overridden inherited no-ops are not dispatched."""
    transformers = pytest.importorskip("transformers")

    class HFCallback(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []
            self.began = False

        def on_train_begin(self, args, state, control, **kwargs):
            self.began = True

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append({**logs, "_step": state.global_step})

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                control.should_training_stop = True

    cb = HFCallback()
    fit = _fit(tmp_path, max_steps=10, logging_steps=2, callbacks=[cb])
    fit.fit(Regression(), _data(40))
    assert cb.began and fit.state.global_step == 4
    loss_logs = [l for l in cb.logs if "loss" in l]
    assert [l["_step"] for l in loss_logs] == [2, 4]
    assert all(isinstance(l["loss"], float) and "learning_rate" in l for l in loss_logs)
    assert "train_runtime" in cb.logs[-1]
    assert fit._hooks.hf["on_evaluate"] == [] and fit._hooks.hf["on_epoch_begin"] == []


# -------------------------------------------------------------------------------------- early stopping ---
class ScriptedMetric(Regression):
    """validation_step logs ``val_metric`` = VALUES[k] on the k-th evaluation (0-based; one per epoch)."""

    def __init__(self, values) -> None:
        super().__init__()
        self.values = list(values)
        self.evaluations = 0
        self.eval_epochs: list[float] = []

    def on_validation_end(self):
        self.evaluations += 1

    def validation_step(self, batch, batch_idx):
        self.eval_epochs.append(self.fit.state.epoch)
        self.log("val_metric", self.values[self.evaluations])


def _early(tmp_path, values, callback, **kwargs) -> tuple[Fit, ScriptedMetric]:
    module = ScriptedMetric(values)
    fit = _fit(tmp_path, num_train_epochs=len(values), eval_strategy="epoch", per_device_eval_batch_size=4,
               callbacks=[callback], **kwargs)
    fit.fit(module, _data(4), _data(4, seed=1))  # 2 optimizer steps per epoch, one eval batch
    return fit, module


def test_early_stopping_patience_min_F_LOOP_6(tmp_path):
    """F-LOOP-6: mode min, patience 2: best at evaluation 1 (0.8), no improvement at evaluations 2 and 3 ->
    training stops after the 4th epoch (global_step 8) although 10 epochs were planned."""
    es = EarlyStopping(monitor="val_metric", patience=2, mode="min")
    fit, module = _early(tmp_path, [1.0, 0.8, 0.9, 0.85, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2], es)
    assert module.evaluations == 4 and module.eval_epochs == [1.0, 2.0, 3.0, 4.0]
    assert fit.state.global_step == 8
    assert es.best == 0.8 and es.wait == 2
    assert es.stopped_step == 8 and es.stopped_epoch == 4.0


def test_early_stopping_mode_max_F_LOOP_6(tmp_path):
    """F-LOOP-6: mode max: an equal value is not an improvement; stops after evaluations 2 and 3 do not beat 0.2."""
    es = EarlyStopping(monitor="val_metric", patience=2, mode="max")
    fit, module = _early(tmp_path, [0.1, 0.2, 0.2, 0.15, 0.9, 0.95, 0.99, 1.0], es)
    assert module.evaluations == 4 and fit.state.global_step == 8
    assert es.best == 0.2


def test_early_stopping_improvement_resets_patience_F_LOOP_6(tmp_path):
    """F-LOOP-6: an improvement resets the wait counter; with strict improvements it never stops."""
    es = EarlyStopping(monitor="val_metric", patience=2, mode="min")
    fit, module = _early(tmp_path, [1.0, 1.1, 0.9, 1.0, 0.8, 0.85], es)
    assert module.evaluations == 6 and fit.state.global_step == 12
    assert es.best == 0.8 and es.wait == 1


def test_early_stopping_does_not_claim_a_stop_it_did_not_cause_F_LOOP_6(tmp_path):
    """F-LOOP-6: when training ends because max_steps is reached, ``stopped_epoch``/``stopped_step`` stay None
    (as Lightning's ``stopped_epoch`` stays 0): EarlyStopping did not stop the run."""
    es = EarlyStopping(monitor="val_metric", patience=2, mode="min")
    fit, module = _early(tmp_path, [1.0, 0.9, 0.8], es)
    assert module.evaluations == 3 and fit.state.global_step == 6 and es.wait == 0
    assert es.stopped_step is None and es.stopped_epoch is None


def test_early_stopping_threshold_F_LOOP_6(tmp_path):
    """F-LOOP-6: with threshold 0.1 the decreases 1.0 -> 0.95 -> 0.92 are too small: stops after 3 epochs;
    without threshold the same sequence keeps improving."""
    values = [1.0, 0.95, 0.92, 0.5, 0.4, 0.3]
    es = EarlyStopping(monitor="val_metric", patience=2, threshold=0.1, mode="min")
    fit, module = _early(tmp_path, values, es)
    assert module.evaluations == 3 and fit.state.global_step == 6 and es.best == 1.0

    es = EarlyStopping(monitor="val_metric", patience=2, mode="min")
    fit, module = _early(tmp_path / "b", values, es)
    assert module.evaluations == 6 and fit.state.global_step == 12


def test_early_stopping_hf_alias_names_F_LOOP_6(tmp_path):
    """F-LOOP-6: ``EarlyStoppingCallback(early_stopping_patience=, early_stopping_threshold=)`` is HF's class: the
    metric and direction from ``metric_for_best_model`` / ``greater_is_better``, compared with ``state.best_metric``
    (the Lightning-style ``EarlyStopping`` still takes HF's keyword names)."""
    es = EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=0.05)
    assert es.early_stopping_patience == 1 and es.early_stopping_threshold == 0.05
    assert EarlyStopping(early_stopping_patience=1, early_stopping_threshold=0.05).patience == 1
    fit, module = _early(tmp_path, [0.5, 0.6, 0.62, 0.9, 1.0], es, metric_for_best_model="val_metric",
                         greater_is_better=True)
    # 0.6 beats 0.5 by more than 0.05; 0.62 does not beat 0.6 by more than 0.05 -> stop after evaluation 3
    assert module.evaluations == 3 and fit.state.global_step == 6
    assert es.early_stopping_patience_counter == 1 and fit.state.best_metric == 0.62


def test_early_stopping_defaults_to_eval_loss_F_LOOP_6(tmp_path):
    """F-LOOP-6: without a monitor, ``eval_loss`` (mode min) is watched; a missing metric raises a KeyError that
    names the metrics present."""

    class ConstantLoss(Regression):
        def validation_step(self, batch, batch_idx):
            return torch.tensor(1.0)

    fit = _fit(tmp_path, num_train_epochs=10, eval_strategy="epoch", callbacks=[EarlyStopping(patience=2)])
    fit.fit(ConstantLoss(), _data(4), _data(4))
    assert fit.state.global_step == 6  # evaluation 1 sets best, 2 and 3 do not improve

    fit = _fit(tmp_path, num_train_epochs=2, eval_strategy="epoch",
               callbacks=[EarlyStopping(monitor="eval_accuracy")])
    with pytest.raises(KeyError, match="eval_accuracy.*eval_loss"):
        fit.fit(ConstantLoss(), _data(4), _data(4))


def test_callback_state_is_saved_in_checkpoints_F_LOOP_6(tmp_path):
    """F-LOOP-6: a checkpoint holds every callback's ``state_dict`` under its ``state_key`` (EarlyStopping's
    best value and wait counter at the time of the save)."""
    es = EarlyStopping(monitor="val_metric", patience=5, mode="min")
    module = ScriptedMetric([1.0, 0.5, 0.7])
    fit = _fit(tmp_path, num_train_epochs=3, eval_strategy="epoch", save_strategy="epoch",
               per_device_eval_batch_size=4, callbacks=[es])
    fit.fit(module, _data(4), _data(4, seed=1))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    states = {}
    for step in (2, 4, 6):
        path = tmp_path / f"checkpoint-{step}" / "training_state.pt"
        states[step] = fit.strategy.checkpoint_io.load_checkpoint(str(path), weights_only=False)["callbacks"]
    assert states[2]["EarlyStopping"] == {"best": 1.0, "wait": 0, "stopped_epoch": None, "stopped_step": None}
    assert states[4]["EarlyStopping"]["best"] == 0.5
    assert states[6]["EarlyStopping"]["best"] == 0.5 and states[6]["EarlyStopping"]["wait"] == 1


def test_early_stopping_bad_arguments_F_LOOP_6():
    """F-LOOP-6: bad patience / threshold / mode are refused with a message naming the value."""
    with pytest.raises(ValueError, match="patience=0"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="threshold=-1"):
        EarlyStopping(threshold=-1)
    with pytest.raises(ValueError, match="mode='maximum'.*'min' or 'max'"):
        EarlyStopping(mode="maximum")


def test_current_epoch_is_the_running_epoch_in_epoch_end_hooks_F_LOOP_6(tmp_path):
    """F-LOOP-6 / F-CORE-1: ``module.current_epoch`` is the zero-based index of the running epoch, also in
    ``on_train_epoch_end`` and in the evaluation at the end of that epoch (Lightning semantics)."""

    class Epochs(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.at_start, self.at_end, self.at_val = [], [], []

        def on_train_epoch_start(self):
            self.at_start.append(self.current_epoch)

        def on_train_epoch_end(self):
            self.at_end.append(self.current_epoch)

        def validation_step(self, batch, batch_idx):
            self.at_val.append(self.current_epoch)

    module = Epochs()
    _fit(tmp_path, num_train_epochs=3, eval_strategy="epoch", per_device_eval_batch_size=4).fit(
        module, _data(4), _data(4))
    assert module.at_start == [0, 1, 2]
    assert module.at_end == [0, 1, 2]
    assert module.at_val == [0, 1, 2]
