"""The Lightning door's loop semantics, each run under ``lightning.Trainer`` and ``taskfit.lightning.Trainer`` with
only the import changed (F-LIT-DOOR): skipping the rest of an epoch, early stopping at the end of a training
epoch, ``estimated_stepping_batches``, the validation interval, the sanity check and its hooks."""

import warnings

import pytest
import torch
from harness import data, linear, same_weights
from two_doors import callbacks_of, frameworks, with_evaluation
from torch.nn import functional as F


def script(L, make, tmp_path, train=None, val=None, callbacks=None, **flags):
    """The user's script with ``L`` as its ``lightning`` import: module, Trainer (no logger, checkpoint, bar or
    summary unless given), fit. Returns ``(module, trainer)``."""
    torch.manual_seed(0)
    module = make(L.LightningModule)()
    flags = dict(dict(logger=False, enable_checkpointing=False, num_sanity_val_steps=0), **flags)
    trainer = L.Trainer(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False,
                        callbacks=callbacks(L) if callbacks else None, **flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train or data(), val)
    return module, trainer


def both(make, tmp_path, **kw):
    return [script(L, make, tmp_path / name, **kw) for name, L in frameworks().items()]


def recording(make_body):
    """``make_body`` with every training batch start and validation batch recorded in ``calls``."""
    def make(base):
        class M(make_body(base)):
            def __init__(self):
                super().__init__()
                self.calls = []

            def on_train_batch_start(self, batch, batch_idx):
                self.calls.append(("train", self.current_epoch, batch_idx))
                parent = getattr(super(), "on_train_batch_start", None)
                return parent(batch, batch_idx) if parent is not None else None

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.calls.append(("val", self.current_epoch, batch_idx))
                self.log("val_loss", F.mse_loss(self.layer(x), y))
        return M
    return make


def test_F_LIT_DOOR_12_minus_one_from_on_train_batch_start_skips_the_rest_of_the_epoch(tmp_path):
    """-1 at batch 2 of epoch 0 (4 batches): batches 2, 3 are not trained, epoch 0 has no validation, epoch 1 runs
    whole; a StepLR of interval "step" steps at the skipped batch as in Lightning. Same weights bitwise, steps,
    calls and learning rate."""
    def make(base):
        class M(linear(base)):
            def on_train_batch_start(self, batch, batch_idx):
                return -1 if (self.current_epoch, batch_idx) == (0, 2) else None

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return M

    (ml, tl), (mt, tt) = both(recording(make), tmp_path, max_epochs=2, val=data(n=8))
    assert mt.calls == ml.calls
    assert [c for c in ml.calls if c[1] == 0] == [("train", 0, 0), ("train", 0, 1), ("train", 0, 2)]
    assert tt.global_step == tl.global_step == 6 and tt.current_epoch == tl.current_epoch == 2
    assert same_weights(ml, mt)
    assert tt.optimizers[0].param_groups[0]["lr"] == pytest.approx(tl.optimizers[0].param_groups[0]["lr"])


def _epoch_logging(base):
    class M(linear(base)):
        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def on_train_epoch_end(self):
            self.log("rising", float(self.current_epoch))  # logged in the module's own epoch-end hook

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
    return M


@pytest.mark.parametrize("monitor", ["train_loss", "rising"])
def test_F_LIT_DOOR_13_early_stopping_on_train_epoch_end(monitor, tmp_path):
    """EarlyStopping(check_on_train_epoch_end=True, log_rank_zero_only=True) reads the epoch's aggregate of a
    training_step value and a value the module logs in its own on_train_epoch_end (checked after it, as
    Lightning), with Lightning's mode="min" default: same stop, stopped_epoch, wait_count, best_score."""
    runs = []
    for module_trainer in both(_epoch_logging, tmp_path / monitor, max_epochs=6, callbacks=lambda L: [
            callbacks_of(L).EarlyStopping(monitor=monitor, patience=1, check_on_train_epoch_end=True,
                                        log_rank_zero_only=True)]):
        es = module_trainer[1].early_stopping_callback
        runs.append((module_trainer[1].global_step, module_trainer[1].current_epoch, es.stopped_epoch,
                     es.wait_count, float(es.best_score)))
    assert runs[0] == runs[1]
    assert runs[0][:3] == ((24, 6, 0) if monitor == "train_loss" else (8, 2, 1))


def test_F_LIT_DOOR_13_early_stopping_without_validation_checks_at_epoch_end(tmp_path):
    """check_on_train_epoch_end=None and no validation: Lightning checks at the end of each training epoch."""
    runs = both(_epoch_logging, tmp_path, max_epochs=6,
                callbacks=lambda L: [callbacks_of(L).EarlyStopping(monitor="rising", patience=1)])
    assert [(t.global_step, t.early_stopping_callback.stopped_epoch) for _, t in runs] == [(8, 1), (8, 1)]


@pytest.mark.parametrize("flags", [dict(max_epochs=3), dict(max_epochs=3, accumulate_grad_batches=3),
                                   dict(max_steps=5), dict(max_epochs=2, max_steps=100),
                                   dict(max_epochs=2, limit_train_batches=3)],
                         ids=["epochs", "accumulate", "max_steps", "epochs_first", "limit_train"])
def test_F_LIT_DOOR_14_estimated_stepping_batches(flags, tmp_path):
    """trainer.estimated_stepping_batches read in configure_optimizers (for OneCycleLR) equals Lightning's."""
    def make(base):
        class M(linear(base)):
            def configure_optimizers(self):
                self.estimate = self.trainer.estimated_stepping_batches
                return super().configure_optimizers()
        return M

    (ml, tl), (mt, tt) = both(make, tmp_path, **flags)
    assert mt.estimate == ml.estimate == tl.estimated_stepping_batches == tt.estimated_stepping_batches


@pytest.mark.parametrize("flags", [dict(val_check_interval=3), dict(val_check_interval=0.5),
                                   dict(check_val_every_n_epoch=2),
                                   dict(val_check_interval=5, check_val_every_n_epoch=None),
                                   dict(val_check_interval=2, accumulate_grad_batches=2)],
                         ids=["int", "fraction", "every_2_epochs", "over_epochs", "accumulate"])
def test_F_LIT_DOOR_15_validation_interval_matches_lightning(flags, tmp_path):
    """val_check_interval=3 with 4 batches per epoch validates after batches 3, 7, 11 (counted per epoch, not at
    the epoch's end); 0.5 after every 2nd batch of each epoch; check_val_every_n_epoch=2 after epoch 2 only; with
    check_val_every_n_epoch=None an int counts batches over epochs. Same calls in order, same weights."""
    (ml, tl), (mt, tt) = both(recording(linear), tmp_path, max_epochs=3, val=data(n=8), **flags)
    assert mt.calls == ml.calls
    assert same_weights(ml, mt) and tt.global_step == tl.global_step
    if flags == dict(val_check_interval=3):
        after = [sum(c[0] == "train" for c in ml.calls[:i]) for i, c in enumerate(ml.calls) if c[0] == "val"
                 and c[2] == 0]
        assert after == [3, 7, 11]


def test_F_LIT_DOOR_15_validation_interval_refusals(tmp_path):
    """An int interval above the epoch's batches raises Lightning's message before training; a float outside
    [0, 1] or a float with check_val_every_n_epoch=None raises at construction, naming the value."""
    import taskfit.lightning as L

    with pytest.raises(ValueError, match=r"`val_check_interval` \(5\) must be less than or equal"):
        script(L, recording(linear), tmp_path, val=data(n=8), val_check_interval=5)
    with pytest.raises(ValueError, match="1.5"):
        L.Trainer(val_check_interval=1.5)
    with pytest.raises(ValueError, match="check_val_every_n_epoch=None"):
        L.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)


SANITY_MODULE_HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_epoch_end",
                       "on_validation_start", "on_validation_end", "on_validation_epoch_end", "validation_step",
                       "on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad")
SANITY_CALLBACK_HOOKS = ("on_sanity_check_start", "on_sanity_check_end", "on_train_start", "on_validation_start",
                         "on_validation_end")


def _sanity_module(calls):
    def make(base):
        class M(linear(base)):
            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y))

        class R(M):
            pass

        for name in SANITY_MODULE_HOOKS:
            def hook(self, *args, __name=name, **kwargs):
                calls.append(("module", __name, self.training))
                parent = getattr(super(R, self), __name, None)
                return parent(*args, **kwargs) if parent is not None else None
            setattr(R, name, hook)
        return R
    return make


def _sanity_callback(L, calls):
    class C(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            pl_module.log("from_callback", float(trainer.sanity_checking) + 3.0)

    for name in SANITY_CALLBACK_HOOKS:
        setattr(C, name, lambda self, trainer, module, __name=name: calls.append(
            ("callback", __name, trainer.sanity_checking)))
    return C()


def test_F_LIT_DOOR_16_sanity_check_and_validation_model_hooks_match_lightning(tmp_path):
    """num_sanity_val_steps=2 (Lightning's default) runs between on_fit_start and on_train_start inside
    on_sanity_check_start/end; on_validation_model_zero_grad/eval/train are called where Lightning calls them (in
    the same training mode); a value a callback logs with pl_module.log in on_validation_epoch_end reaches
    callback_metrics, and the sanity pass's values do not stay there. Same calls, same weights."""
    runs = []
    for name, L in frameworks().items():
        calls = []
        module, trainer = script(L, _sanity_module(calls), tmp_path / name, val=data(n=16), train=data(n=8),
                                 max_epochs=1, num_sanity_val_steps=2,
                                 callbacks=lambda L, calls=calls: [_sanity_callback(L, calls)])
        runs.append((module, trainer, calls))
    (ml, tl, cl), (mt, tt, ct) = runs
    assert ct == cl
    assert cl.count(("module", "validation_step", False)) == 2 + 4  # 2 sanity batches, then the 4 of the epoch
    assert cl.index(("callback", "on_sanity_check_end", True)) < cl.index(("callback", "on_train_start", False))
    assert same_weights(ml, mt)
    assert float(tt.callback_metrics["from_callback"]) == float(tl.callback_metrics["from_callback"]) == 3.0
    assert float(tt.callback_metrics["val_loss"]) == pytest.approx(float(tl.callback_metrics["val_loss"]))


_evaluated = with_evaluation(linear)


def test_F_LIT_DOOR_17_ckpt_path_last_resumes_from_save_last(tmp_path):
    """A new Trainer with ModelCheckpoint(save_last=True) on the same folder and fit(ckpt_path="last") resumes
    from the last checkpoint (epoch 2 of 3 done): same steps, epochs and weights as Lightning's resume."""
    runs = []
    for name, L in frameworks().items():
        folder = tmp_path / name
        def checkpoints(L, folder=folder):
            return [callbacks_of(L).ModelCheckpoint(dirpath=str(folder / "ck"), save_last=True)]

        script(L, _evaluated, folder, val=data(n=8), max_epochs=2, enable_checkpointing=True, callbacks=checkpoints)
        torch.manual_seed(1)  # the resume must not depend on the new module's initial weights
        module = _evaluated(L.LightningModule)()
        trainer = L.Trainer(default_root_dir=str(folder), enable_progress_bar=False, enable_model_summary=False,
                            logger=False, max_epochs=3, num_sanity_val_steps=0, callbacks=checkpoints(L))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, data(), data(n=8), ckpt_path="last")
        runs.append((module, trainer))
    (ml, tl), (mt, tt) = runs
    assert tt.global_step == tl.global_step == 12 and tt.current_epoch == tl.current_epoch == 3
    assert same_weights(ml, mt)


def test_F_LIT_DOOR_17_ckpt_path_best_without_monitor_tests_the_last_checkpoint(tmp_path):
    """test(ckpt_path="best") after a fit whose ModelCheckpoint monitors nothing (Lightning's default one) scores
    the last saved checkpoint, as Lightning: the same values."""
    results = []
    for name, L in frameworks().items():
        _, trainer = script(L, _evaluated, tmp_path / name, val=data(n=8), max_epochs=2, enable_checkpointing=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append(trainer.test(ckpt_path="best", dataloaders=data()))
    assert results[0] == results[1]


@pytest.mark.parametrize("flags", [dict(max_epochs=2), dict(max_epochs=3, max_steps=6),
                                   dict(max_epochs=2, log_every_n_steps=2)],
                         ids=["epochs", "max_steps_counts_optimizer_steps", "logging"])
def test_F_LIT_DOOR_18_manual_optimization_global_step_counts_optimizer_steps(flags, tmp_path):
    """Manual optimization with two optimizers (a GAN; the discriminator steps every 2nd batch): global_step
    (trainer and module) counts optimizer steps as Lightning, max_steps limits optimizer steps, epochs still run
    all their batches, and log rows come every log_every_n_steps batches with the same values (the step a logger
    receives is taskfit's global_step, not Lightning's batch count: not asserted)."""
    from test_lightning_manual import gan

    def make(base):
        class G(gan(step_every=2)(base)):
            def on_train_batch_end(self, outputs, batch, batch_idx):
                self.steps_seen = [*getattr(self, "steps_seen", []), self.global_step]
        return G

    from harness import recording_logger

    runs = []
    for name, L in frameworks().items():
        logger = recording_logger()
        runs.append((*script(L, make, tmp_path / name, logger=logger, **flags), logger))
    (ml, tl, ll), (mt, tt, lt) = runs
    assert mt.steps_seen == ml.steps_seen and tt.global_step == tl.global_step
    assert tl.global_step == {"epochs": 12, "max_steps_counts_optimizer_steps": 6, "logging": 12}[
        "epochs" if flags == dict(max_epochs=2) else "logging" if "log_every_n_steps" in flags else
        "max_steps_counts_optimizer_steps"]
    assert same_weights(ml, mt)
    if "log_every_n_steps" in flags:
        theirs = [row["g_loss"] for _, row in ll.rows if "g_loss" in row]
        assert [row["g_loss"] for _, row in lt.rows if "g_loss" in row] == pytest.approx(theirs) and len(theirs) == 4
