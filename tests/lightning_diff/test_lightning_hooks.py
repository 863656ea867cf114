"""Differential tests against Lightning: the order of module and callback hooks during fit (scenarios after
Lightning's tests_pytorch/models/test_hooks.py), and that overriding a hook changes behaviour as in Lightning."""

import pytest
import torch
from torch.nn import functional as F

from harness import data, linear, run_lightning, run_taskfit, same_weights

MODULE_HOOKS = (
    "prepare_data", "setup", "configure_model", "configure_optimizers", "on_fit_start", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "on_before_zero_grad", "optimizer_zero_grad", "training_step",
    "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "configure_gradient_clipping", "optimizer_step", "lr_scheduler_step", "on_train_batch_end",
    "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start", "validation_step",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
    "on_train_end", "on_fit_end", "teardown", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer",
)
CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_zero_grad", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_train_batch_end", "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
    "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
    "on_train_end", "on_fit_end", "teardown",
)


def recorder(calls, hooks=MODULE_HOOKS, scheduler=True):
    def make(base):
        class Recorded(linear(base)):
            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y))

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                if not scheduler:
                    return opt
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}

        class Recording(Recorded):
            pass

        for name in hooks:
            def hook(self, *args, __name=name, **kwargs):
                calls.append(f"module.{__name}")
                fn = getattr(super(Recording, self), __name, None)
                return fn(*args, **kwargs) if fn is not None else None
            setattr(Recording, name, hook)
        return Recording
    return make


def callback(base, calls):
    class Rec(base):
        pass

    for name in CALLBACK_HOOKS:
        def hook(self, *_, __name=name, **kwargs):  # not named `args`: that marks an HF-style hook
            calls.append(f"callback.{__name}")
        setattr(Rec, name, hook)
    return Rec()


SCENARIOS = {
    "one_epoch_with_validation": dict(max_epochs=1),
    "two_epochs_accumulate_2": dict(max_epochs=2, accumulate_grad_batches=2),
    "clipping": dict(max_epochs=1, gradient_clip_val=1.0),
    "max_steps_mid_epoch": dict(max_epochs=3, max_steps=3),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_F_LOOP_6_hook_sequence_matches_lightning(name, tmp_path):
    """Module and callback hooks fire in Lightning's order: setup before configure_optimizers, gradients cleared
    before a window's first training_step, validation before on_train_epoch_end, the epoch scheduler stepped
    through lr_scheduler_step, teardown last."""
    import lightning as L
    from taskfit import Callback

    opts = SCENARIOS[name]
    seq_l, seq_t = [], []
    run_lightning(recorder(seq_l), data(n=8), data(n=4, seed=1), callbacks=[callback(L.Callback, seq_l)], **opts)
    run_taskfit(recorder(seq_t), data(n=8), data(n=4, seed=1), tmp_path=tmp_path,
                callbacks=[callback(Callback, seq_t)], **opts)
    assert len(seq_l) > 40
    if name != "max_steps_mid_epoch":
        assert seq_t == seq_l
    else:  # documented difference: an epoch cut short by max_steps still ends with its validation (HF)
        def train_only(seq):
            return [h for h in seq if "validation" not in h and "batch_transfer" not in h and "transfer_" not in h]
        assert train_only(seq_t) == train_only(seq_l)
        assert seq_t.count("module.validation_step") == seq_l.count("module.validation_step") + 1


def test_F_LOOP_6_train_batch_end_outputs_and_datamodule_teardown(tmp_path):
    """Callback.on_train_batch_end gets {'loss': detached loss}; a DataModule's prepare_data/setup/teardown run."""
    import lightning as L
    from taskfit import Callback, DataModule

    def outputs_cb(base, seen):
        class Out(base):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                seen.append((sorted(outputs), float(outputs["loss"]), outputs["loss"].requires_grad))
        return Out()

    def dm(base, calls):
        class DM(base):
            def prepare_data(self):
                calls.append("prepare_data")

            def setup(self, stage):
                calls.append(f"setup:{getattr(stage, 'value', stage)}")

            def train_dataloader(self):
                return data(n=8)

            def teardown(self, stage):
                calls.append(f"teardown:{getattr(stage, 'value', stage)}")
        return DM()

    seen_l, seen_t, dm_l, dm_t = [], [], [], []
    make = recorder([], hooks=())
    run_lightning(make, None, callbacks=[outputs_cb(L.Callback, seen_l)], fit_kwargs=dict(datamodule=dm(
        L.LightningDataModule, dm_l)))
    run_taskfit(make, None, tmp_path=tmp_path, callbacks=[outputs_cb(Callback, seen_t)],
                fit_kwargs=dict(datamodule=dm(DataModule, dm_t)))
    assert seen_l == seen_t and len(seen_t) == 2 and seen_t[0][0] == ["loss"] and not seen_t[0][2]
    assert dm_l == dm_t == ["prepare_data", "setup:fit", "teardown:fit"]


def overriding(name):
    def make(base):
        class Overrides(linear(base)):
            def __init__(self):
                super().__init__()
                self.events = []

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)]

            if name == "optimizer_step_warmup":
                def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
                    optimizer.step(closure=optimizer_closure)
                    if self.trainer.global_step < 3:  # hand-written warm-up
                        for pg in optimizer.param_groups:
                            pg["lr"] = 0.1 * (self.trainer.global_step + 2) / 4
            if name == "optimizer_step_skip_odd":
                def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
                    if batch_idx % 2 == 0:
                        optimizer.step(closure=optimizer_closure)
                    else:
                        optimizer_closure()
            if name == "optimizer_zero_grad_never":
                def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
                    self.events.append(batch_idx)  # gradients accumulate over the whole run
            if name == "lr_scheduler_step_twice":
                def lr_scheduler_step(self, scheduler, metric):
                    scheduler.step()
                    scheduler.step()
            if name == "configure_gradient_clipping_value":
                def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                    self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")
            if name == "backward_scaled":
                def backward(self, loss, *args, **kwargs):
                    (loss * 3).backward()
            if name == "batch_transfer":
                def on_before_batch_transfer(self, batch, dataloader_idx):
                    x, y = batch
                    return x * 2, y

                def transfer_batch_to_device(self, batch, device, dataloader_idx):
                    x, y = batch
                    return x.to(device), y.to(device) + 1

                def on_after_batch_transfer(self, batch, dataloader_idx):
                    x, y = batch
                    return x - 0.5, y
            if name == "configure_model":
                def configure_model(self):
                    if not hasattr(self, "extra"):
                        torch.manual_seed(1)  # taskfit seeds the run (args.seed) first, Lightning does not
                        self.extra = torch.nn.Linear(1, 1)

                def training_step(self, batch, batch_idx):
                    x, y = batch
                    return F.mse_loss(self.extra(self.layer(x)), y)
            if name == "setup_builds_layer":
                def setup(self, stage):
                    self.events.append(stage)
                    self.bias = torch.nn.Parameter(torch.zeros(1))

                def training_step(self, batch, batch_idx):
                    x, y = batch
                    return F.mse_loss(self.layer(x) + self.bias, y)
        return Overrides
    return make


OVERRIDES = ("optimizer_step_warmup", "optimizer_step_skip_odd", "optimizer_zero_grad_never",
             "lr_scheduler_step_twice", "configure_gradient_clipping_value", "backward_scaled", "batch_transfer",
             "configure_model", "setup_builds_layer")


@pytest.mark.parametrize("name", OVERRIDES)
def test_F_LOOP_6_overriding_a_hook_changes_behaviour_as_in_lightning(name, tmp_path):
    make = overriding(name)
    a, _ = run_lightning(make, data(), max_epochs=2)
    b, _ = run_taskfit(make, data(), tmp_path=tmp_path, max_epochs=2)
    assert same_weights(a, b) and a.events == b.events
    torch.manual_seed(0)
    plain_l, _ = run_lightning(overriding("none"), data(), max_epochs=2)
    if name != "setup_builds_layer":
        assert not same_weights(a, plain_l) or name == "optimizer_zero_grad_never" and a.events == []
