"""Differential tests of the optimizer step under the Lightning door (issue 27, trainer/optimization/): the same
module under ``lightning.Trainer`` and ``taskfit.lightning.Trainer`` (only the import changes); equal
``training_step`` calls, hook calls, optimizer ``step`` calls and weights (bitwise, fp32 on CPU)."""

import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.optim import lr_scheduler as S

from harness import data, same_weights
from two_doors import callbacks_of, frameworks

DOORS = frameworks()
QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class RecordingSGD(torch.optim.SGD):
    """SGD whose ``step`` records its keyword arguments (``optim="sgd"`` must reach it)."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.calls = []

    def step(self, closure=None, **kwargs):
        self.calls.append(sorted(kwargs))
        return super().step(closure)


def _fit(L, make, tmp_path, loader=None, **flags):
    torch.manual_seed(0)
    model = make(L.LightningModule)()
    trainer = L.Trainer(default_root_dir=str(tmp_path / L.__name__), **{**QUIET, **flags})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader if loader is not None else data(16, batch_size=4))
    return model, trainer


def _both(make, tmp_path, **flags):
    return [_fit(L, make, tmp_path, **flags) for L in DOORS.values()]


def _counting(base, configure, none_at=()):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.steps = self.backwards = self.before_step = 0

        def training_step(self, batch, batch_idx):
            self.steps += 1
            if batch_idx in none_at:
                return None
            x, y = batch
            return F.mse_loss(self.layer(x), y)

        def on_before_backward(self, loss):
            self.backwards += 1

        def on_before_optimizer_step(self, optimizer):
            self.before_step += 1

        def configure_optimizers(self):
            return configure(self)
    return Net


@pytest.mark.parametrize("accumulate", [1, 2])
def test_F_LIT_DOOR_lbfgs_gets_the_closure_inside_optimizer_step(tmp_path, accumulate):
    """F-LIT-DOOR (G18): under automatic optimization the closure (training_step, zero_grad, backward,
    ``on_before_optimizer_step``) runs inside ``optimizer.step(closure=...)``: an ``LBFGS(max_iter=3)`` evaluates it
    three times per step (the first micro-batches of a window run it once, outside the step), as Lightning."""
    make = lambda base: _counting(base, lambda m: torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3))  # noqa: E731
    (ml, tl), (mt, tt) = _both(make, tmp_path, max_epochs=1, accumulate_grad_batches=accumulate)
    assert (mt.steps, mt.backwards, mt.before_step, tt.global_step) == (
        ml.steps, ml.backwards, ml.before_step, tl.global_step)
    assert mt.steps > 4 and tt.global_step == 4 // accumulate
    assert same_weights(ml, mt)


def test_F_LIT_DOOR_fit_trains_lbfgs_with_its_closure(tmp_path):
    """F-LIT-DOOR (G18): ``Fit`` (HF's door) gives an optimizer whose ``step`` requires a closure (``LBFGS``) the
    closure too (HF's Trainer cannot train it); its weights equal the Lightning door's without clipping."""
    from taskfit import Fit, TaskModule

    make = lambda base: _counting(base, lambda m: torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3))  # noqa: E731
    torch.manual_seed(0)
    module = make(TaskModule)()
    Fit(output_dir=str(tmp_path / "fit"), report_to="none", disable_tqdm=True, save_strategy="no",
        max_grad_norm=0.0, num_train_epochs=1).fit(module, data(16, batch_size=4))
    ml, _ = _fit(DOORS["lightning"], make, tmp_path, max_epochs=1)
    assert module.steps == ml.steps and same_weights(ml, module)


def test_F_LIT_DOOR_manual_step_keywords_and_optimizer_class(tmp_path):
    """F-LIT-DOOR (G18, G19): ``opt.step(closure=c, optim="sgd")`` reaches the optimizer's ``step`` with the
    keyword, the closure runs inside it, and ``self.optimizers()`` is an instance of the optimizer's own class,
    as Lightning's ``LightningOptimizer``."""
    def make(base):
        class Manual(base):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.layer = torch.nn.Linear(4, 1)
                self.kinds = []

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                self.kinds.append((isinstance(opt, RecordingSGD), isinstance(opt, torch.optim.Optimizer),
                                   type(opt).__name__))
                x, y = batch

                def closure():
                    loss = F.mse_loss(self.layer(x), y)
                    self.manual_backward(loss)
                    return loss

                if batch_idx % 2 == 0:
                    opt.step(closure=closure, optim="sgd")
                else:
                    opt.step(closure=closure)
                opt.zero_grad()

            def configure_optimizers(self):
                return RecordingSGD(self.parameters(), lr=0.1)
        return Manual

    (ml, tl), (mt, tt) = _both(make, tmp_path, max_epochs=1)
    assert mt.kinds == ml.kinds and mt.kinds[0] == (True, True, "LightningRecordingSGD")
    calls = [t.optimizers[0].calls for t in (tl, tt)]
    assert calls[1] == calls[0] == [["optim"], [], ["optim"], []]
    assert tt.global_step == tl.global_step == 4 and same_weights(ml, mt)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_F_LIT_DOOR_training_step_none_skips_the_batch(tmp_path, accumulate):
    """F-LIT-DOOR (G16): ``training_step`` returning None under automatic optimization runs no backward for that
    batch (Lightning warns; its zero_grad and optimizer step still run, on no gradients); ``Fit`` keeps HF's
    refusal (TypeError: HF cannot backpropagate a missing loss)."""
    from taskfit import Fit, TaskModule

    make = lambda base: _counting(base, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), none_at=(1, 2))  # noqa: E731
    (ml, tl), (mt, tt) = _both(make, tmp_path, max_epochs=1, accumulate_grad_batches=accumulate)
    assert (mt.steps, mt.backwards, mt.before_step, tt.global_step) == (
        ml.steps, ml.backwards, ml.before_step, tl.global_step)
    assert mt.backwards == 2 and same_weights(ml, mt)
    with pytest.raises(TypeError, match="training_step must return a scalar loss tensor"):
        Fit(output_dir=str(tmp_path / "fit"), report_to="none", disable_tqdm=True, save_strategy="no",
            num_train_epochs=1).fit(make(TaskModule)(), data(16, batch_size=4))


def test_F_LIT_DOOR_max_epochs_zero_sets_up_and_trains_nothing(tmp_path):
    """F-LIT-DOOR (G20): ``Trainer(max_epochs=0)`` sets up (``configure_optimizers`` read, so a bad scheduler
    still fails), runs ``on_fit_start``, the sanity check and ``on_fit_end``, and trains nothing: no
    ``on_train_start``/``on_train_end``, no ``training_step``, ``global_step`` and ``current_epoch`` 0, weights as
    initialised."""
    def make(base):
        class Net(_counting(base, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))):
            calls = []

            def validation_step(self, batch, batch_idx):
                self.calls.append("validation_step")

            def on_fit_start(self):
                self.calls.append("on_fit_start")

            def on_fit_end(self):
                self.calls.append("on_fit_end")

            def on_train_start(self):
                self.calls.append("on_train_start")

            def on_train_end(self):
                self.calls.append("on_train_end")

            def configure_optimizers(self):
                self.calls.append("configure_optimizers")
                return super().configure_optimizers()
        return Net

    results = []
    for L in DOORS.values():
        torch.manual_seed(0)
        model = make(L.LightningModule)()
        model.calls = []
        init = {k: v.clone() for k, v in model.state_dict().items()}
        trainer = L.Trainer(default_root_dir=str(tmp_path / L.__name__), max_epochs=0, **QUIET)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, data(8, batch_size=4), data(8, batch_size=4))
        assert all(torch.equal(init[k], v) for k, v in model.state_dict().items())
        results.append((model.calls, model.steps, trainer.global_step, trainer.current_epoch))
    assert results[1] == results[0]
    assert results[0] == (["configure_optimizers", "on_fit_start", "validation_step", "validation_step",
                           "on_fit_end"], 0, 0, 0)


def test_F_LIT_DOOR_max_epochs_not_set_warns_at_fit(tmp_path):
    """F-LIT-DOOR: ``fit`` without ``max_epochs``/``max_steps`` warns as Lightning (1000 epochs), with Lightning's
    ``PossibleUserWarning`` class once a Lightning program imported it; ``fast_dev_run`` and ``max_epochs`` do not
    warn."""
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    def make(base):
        class Stop(_counting(base, lambda m: torch.optim.SGD(m.parameters(), lr=0.1))):
            def training_step(self, batch, batch_idx):
                self.trainer.should_stop = True
                return super().training_step(batch, batch_idx)
        return Stop

    epochs = []
    for L in DOORS.values():
        torch.manual_seed(0)
        trainer = L.Trainer(default_root_dir=str(tmp_path / L.__name__), limit_train_batches=1, **QUIET)
        with pytest.warns(PossibleUserWarning, match="`max_epochs` was not set. Setting it to 1000 epochs"):
            trainer.fit(make(L.LightningModule)(), data(8, batch_size=4))
        epochs.append((trainer.max_epochs, trainer.current_epoch))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PossibleUserWarning)
            L.Trainer(default_root_dir=str(tmp_path / "d"), fast_dev_run=1, **QUIET).fit(
                make(L.LightningModule)(), data(8, batch_size=4))
    assert epochs[1] == epochs[0] == (1000, 1)


@pytest.mark.parametrize("on_train_epoch_end", [False, True])
def test_F_LIT_DOOR_step_plateau_scheduler_steps_after_the_batch_validation(tmp_path, on_train_epoch_end):
    """F-LIT-DOOR (G22): a ``ReduceLROnPlateau`` of interval ``"step"`` steps after the validation that follows
    its batch, so a checkpoint saved by that validation holds it one step behind the other step schedulers (saved
    at the training epoch's end: not behind), and it can monitor a value that validation logs: the learning rates
    per step, the checkpointed scheduler states and the weights equal Lightning's."""
    def make(base):
        class Plateau(_counting(base, None)):
            def __init__(self):
                super().__init__()
                self.lrs, self.saved = [], []

            def training_step(self, batch, batch_idx):
                self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
                self.log("foo", float(batch_idx))
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y) * 0 + 1.0)  # flat: the plateau reduces

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                plateau = S.ReduceLROnPlateau(opt, patience=0, factor=0.5)
                return [opt], [{"scheduler": plateau, "interval": "step", "monitor": "val_loss", "strict": False},
                               {"scheduler": S.StepLR(opt, step_size=1, gamma=0.9), "interval": "step"}]

            def on_save_checkpoint(self, checkpoint):
                self.saved.append([(s.get("last_epoch"), s.get("_step_count")) for s in checkpoint["lr_schedulers"]])
        return Plateau

    out = []
    for L in DOORS.values():
        torch.manual_seed(0)
        model = make(L.LightningModule)()
        cb = callbacks_of(L).ModelCheckpoint(dirpath=str(tmp_path / L.__name__ / "ckpt"),
                                             save_on_train_epoch_end=on_train_epoch_end)
        flags = {**QUIET, "enable_checkpointing": True}
        trainer = L.Trainer(default_root_dir=str(tmp_path / L.__name__), max_epochs=2, val_check_interval=2,
                            num_sanity_val_steps=0, limit_val_batches=1, callbacks=[cb], **flags)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, data(16, batch_size=4), data(8, batch_size=4))
        out.append(model)
    ml, mt = out
    assert mt.lrs == ml.lrs and mt.saved == ml.saved and same_weights(ml, mt)
    assert len(set(ml.lrs)) > 2  # both schedulers changed the rate


def test_F_LIT_DOOR_precision_optimizer_step_passes_closure_and_keywords():
    """F-LIT-DOOR (G18): ``Precision.optimizer_step(optimizer, closure, **kwargs)`` hands both to
    ``optimizer.step`` (bare ``step()`` without them, as ``Fit`` calls it); ``16-mixed`` runs the closure once,
    steps through the scaler with the keywords, and refuses LBFGS before stepping (ValueError, as Lightning)."""
    from taskfit.precision.precision import MixedPrecision, Precision, cpu_grad_scaler_supported

    layer = torch.nn.Linear(2, 1)
    opt = RecordingSGD(layer.parameters(), lr=0.1)
    ran, backward = [], [torch.Tensor.backward]

    def closure():
        ran.append(1)
        backward[0](layer.weight.sum())  # the plugin's backward scales the loss under 16-mixed
        return 1.0

    assert Precision().optimizer_step(opt, closure, optim="sgd") is True
    assert Precision().optimizer_step(opt) is True
    assert opt.calls == [["optim"], []] and ran == [1]
    if not cpu_grad_scaler_supported():
        pytest.skip("no GradScaler on CPU in this torch")
    mixed = MixedPrecision("16-mixed")
    mixed.setup_device(torch.device("cpu"))
    backward[0] = mixed.backward
    assert mixed.optimizer_step(opt, closure, optim="sgd") is True
    assert opt.calls[-1] == ["optim"] and ran == [1, 1]
    with pytest.raises(ValueError, match="LBFGS optimizer are not compatible"):
        mixed.optimizer_step(torch.optim.LBFGS(layer.parameters()), closure)
    assert ran == [1, 1]
