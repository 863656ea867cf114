"""The Lightning door's ``min_epochs``/``min_steps``, ``EarlyStopping``'s reasons and its restored state, and the
arguments ``configure_gradient_clipping`` receives, each run under ``lightning.Trainer`` and
``taskfit.lightning.Trainer`` with only the import changed (F-LIT-DOOR)."""

import logging
import warnings

import pytest
import torch
from harness import data, linear, same_weights
from two_doors import callbacks_of, frameworks


def script(L, make, tmp_path, callbacks=(), val=None, **flags):
    """The user's script with ``L`` as its ``lightning`` import; returns ``(module, trainer)``."""
    torch.manual_seed(0)
    module = make(L.LightningModule)()
    trainer = L.Trainer(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False,
                        logger=False, enable_checkpointing=False, num_sanity_val_steps=0, callbacks=list(callbacks),
                        **flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, data(n=12), val)
    return module, trainer


def stop_at(epoch, batch=None):
    """A user callback (on either framework's ``Callback``) setting ``trainer.should_stop`` at the end of
    ``epoch``, or after batch ``batch`` of it."""
    def make(L):
        class Stop(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, b, batch_idx):
                if batch is not None and trainer.current_epoch == epoch and batch_idx == batch:
                    trainer.should_stop = True

            def on_train_epoch_end(self, trainer, pl_module):
                if batch is None and trainer.current_epoch == epoch:
                    trainer.should_stop = True
        return Stop()
    return make


def counting(base):
    class M(linear(base)):
        def __init__(self):
            super().__init__()
            self.batches = []

        def on_train_batch_start(self, batch, batch_idx):
            self.batches.append((self.current_epoch, batch_idx))
    return M


@pytest.mark.parametrize(("min_epochs", "min_steps", "stop"), [
    (None, 7, (0, None)), (2, None, (0, None)), (3, 4, (0, None)), (None, 5, (0, 1)), (None, None, (0, 1))])
def test_F_LIT_DOOR_min_epochs_min_steps_hold_a_stop_request(tmp_path, caplog, min_epochs, min_steps, stop):
    """F-LIT-DOOR: a stop request before ``min_epochs`` epochs and ``min_steps`` steps are done is held (the
    epoch goes on; with ``min_steps`` met mid-epoch training stops at that step), as Lightning: the same batches,
    ``current_epoch``, ``global_step``, ``should_stop``, weights, and Lightning's info message once."""
    runs = {}
    for name, L in frameworks().items():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            module, trainer = script(L, counting, tmp_path / name, callbacks=[stop_at(*stop)(L)], max_epochs=6,
                                     min_epochs=min_epochs, min_steps=min_steps)
        told = [r.getMessage() for r in caplog.records if "signaled to stop" in r.getMessage()]
        runs[name] = (module, trainer, told)
    (lm, lt, ltold), (tm, tt, ttold) = runs["lightning"], runs["taskfit"]
    assert tm.batches == lm.batches
    assert (tt.current_epoch, tt.global_step, tt.should_stop) == (lt.current_epoch, lt.global_step, lt.should_stop)
    assert (tt.min_epochs, tt.min_steps) == (lt.min_epochs, lt.min_steps)
    assert ttold[:1] == ltold[:1] and len(ttold) == (1 if ltold else 0)
    assert same_weights(lm, tm)
    if min_steps == 7:  # 3 batches per epoch: the 7th step is the first of the third epoch
        assert tt.global_step == 7 and tt.current_epoch == 3


def _losses(values):
    def make(base):
        class M(linear(base)):
            def validation_step(self, batch, batch_idx):
                pass

            def on_validation_epoch_end(self):
                self.log("val_loss", values[self.current_epoch] if self.current_epoch < len(values) else 0.1)
        return M
    return make


@pytest.mark.parametrize(("values", "kwargs"), [
    ([1.0, 1.0, 1.0, 1.0], {"patience": 2}), ([1.0, 0.5, 0.4], {"stopping_threshold": 0.6}),
    ([1.0, 5.0, 9.0], {"divergence_threshold": 8.0}), ([1.0, 0.5, float("nan")], {"check_finite": True}),
    ([5.0, 4.0, 3.0], {"patience": 3})])
def test_F_LIT_DOOR_early_stopping_reasons(tmp_path, values, kwargs):
    """F-LIT-DOOR: ``EarlyStopping.stopping_reason`` (Lightning's ``EarlyStoppingReason`` names and values),
    ``stopping_reason_message`` (the same words up to the value), ``stopped_epoch``, ``wait_count``,
    ``best_score`` and the epochs trained as Lightning."""
    out = {}
    for name, L in frameworks().items():
        es = callbacks_of(L).EarlyStopping(monitor="val_loss", **kwargs)
        _, trainer = script(L, _losses(values), tmp_path / name, callbacks=[es], val=data(n=4),
                            max_epochs=len(values))
        message = es.stopping_reason_message
        out[name] = (es.stopping_reason.name, es.stopping_reason.value, message and message.split(" = ")[0],
                     es.stopped_epoch, es.wait_count, float(es.best_score), trainer.current_epoch)
    assert out["taskfit"] == out["lightning"]


def test_F_LIT_DOOR_early_stopping_state_crossesframeworks():
    """F-LIT-DOOR: ``EarlyStopping.state_dict`` has Lightning's keys and values; each framework's state loads into
    the other's callback with the same ``stopping_reason``, message, ``wait_count``, ``best_score``, ``patience``;
    ``best_score`` is settable; a state without a reason (Lightning before 2.6) means not stopped."""
    from lightning.pytorch.callbacks import EarlyStopping as LES
    from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason as LReason
    from taskfit.lightning.callbacks import EarlyStopping as TES
    from taskfit.lightning.callbacks import EarlyStoppingReason as TReason

    assert [(r.name, r.value) for r in TReason] == [(r.name, r.value) for r in LReason]
    lit, ours = LES(monitor="val_loss", patience=3), TES(monitor="val_loss", patience=3)
    for es, reason in ((lit, LReason), (ours, TReason)):
        es.stopping_reason, es.stopping_reason_message = reason.PATIENCE_EXHAUSTED, "Test message"
        es.wait_count, es.stopped_epoch, es.best_score = 2, 5, torch.tensor(0.25)
    lstate, tstate = lit.state_dict(), ours.state_dict()
    assert {k: tstate[k] for k in lstate} == lstate and lstate.keys() <= tstate.keys()

    def view(es):
        return (es.stopping_reason.name, es.stopping_reason_message, es.wait_count, es.stopped_epoch,
                float(es.best_score), es.patience)
    into_ours, into_lit = TES(monitor="val_loss"), LES(monitor="val_loss")
    into_ours.load_state_dict(lstate)
    into_lit.load_state_dict({k: tstate[k] for k in lstate})
    assert view(into_ours) == view(into_lit) == view(lit) == ("PATIENCE_EXHAUSTED", "Test message", 2, 5, 0.25, 3)
    old = {"wait_count": 1, "stopped_epoch": 0, "best_score": torch.tensor(0.5), "patience": 3}
    into_ours.load_state_dict(dict(old))
    into_lit.load_state_dict(dict(old))
    assert view(into_ours) == view(into_lit) == ("NOT_STOPPED", None, 1, 0, 0.5, 3)
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    for cls, error in ((LES, MisconfigurationException), (TES, ValueError)):  # docs/lightning.md: ValueError
        with pytest.raises(error, match="^`mode` can be min, max, got unknown$"):
            cls(monitor="val_loss", mode="unknown")


@pytest.mark.parametrize("flags", [{}, {"gradient_clip_val": 0.5},
                                   {"gradient_clip_val": 0.5, "gradient_clip_algorithm": "value"}])
def test_F_LIT_DOOR_configure_gradient_clipping_receives_the_flags_as_given(tmp_path, flags):
    """F-LIT-DOOR: ``configure_gradient_clipping`` receives ``Trainer(gradient_clip_val=, gradient_clip_algorithm=)``
    as given (None when not given, the algorithm None with a value alone), as Lightning; the same weights."""
    def make(base):
        class M(linear(base)):
            def __init__(self):
                super().__init__()
                self.seen = []

            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                algorithm = None if gradient_clip_algorithm is None else str(
                    getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm))
                self.seen.append((gradient_clip_val, algorithm))
                self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        return M
    (lm, _), (tm, _) = [script(L, make, tmp_path / name, max_epochs=1, **flags)
                        for name, L in frameworks().items()]
    assert tm.seen == lm.seen and len(lm.seen) == 3
    assert same_weights(lm, tm)


def test_F_LIT_DOOR_trainer_state_survives_pickling(tmp_path):
    """F-LIT-DOOR: a trained ``Trainer`` (its ``trainer.state`` view included) pickles and unpickles, as the
    ``ddp_spawn`` launcher sends it to each worker; the copy reads the same state."""
    import pickle

    import taskfit.lightning as L

    global _Picklable

    _Picklable = linear(L.LightningModule)  # found by name when unpickled
    _Picklable.__qualname__ = _Picklable.__name__ = "_Picklable"
    _Picklable.__module__ = __name__
    _, trainer = script(L, lambda base: _Picklable, tmp_path, max_epochs=1)
    state = trainer.state
    copy = pickle.loads(pickle.dumps(trainer))
    assert (copy.state.global_step, copy.state.fn, copy.current_epoch) == (state.global_step, state.fn, 1)


def test_F_LIT_DOOR_reload_dataloaders_every_n_epochs(tmp_path):
    """F-LIT-DOOR: ``Trainer(reload_dataloaders_every_n_epochs=2)`` calls the module's ``train_dataloader`` again
    every 2 epochs and trains on the new loader (here longer each time: the epoch's steps follow it), as Lightning:
    the same calls, batches, ``global_step`` and weights."""
    def make(base):
        class M(counting(base)):
            def __init__(self):
                super().__init__()
                self.loaders_at = []

            def train_dataloader(self):
                self.loaders_at.append(self.trainer.current_epoch)
                return data(n=8 + 4 * len(self.loaders_at), seed=len(self.loaders_at))
        return M
    runs = []
    for name, L in frameworks().items():
        torch.manual_seed(0)
        module = make(L.LightningModule)()
        trainer = L.Trainer(default_root_dir=str(tmp_path / name), enable_progress_bar=False, logger=False,
                            enable_model_summary=False, enable_checkpointing=False, max_epochs=5,
                            reload_dataloaders_every_n_epochs=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module)
        runs.append((module, trainer))
    (lm, lt), (tm, tt) = runs
    assert tm.loaders_at == lm.loaders_at == [0, 2, 4]
    assert tm.batches == lm.batches and (tt.global_step, tt.current_epoch) == (lt.global_step, lt.current_epoch)
    assert same_weights(lm, tm)
