"""Lightning's hook calls in ``fit`` and its checkpoint dict, judged by Lightning itself: the same module, with its
hooks wrapped on the instance (as Lightning's tests_pytorch/models/test_hooks.py does), run by
``lightning.Trainer`` and by ``taskfit.lightning.Trainer``; the recorded calls, the dicts ``on_save_checkpoint`` /
``on_load_checkpoint`` receive and the trained weights must be equal (F-LIT-DOOR-HOOKS, F-LIT-CKPT)."""

import functools
import warnings

import torch
from harness import data, linear
from two_doors import callbacks_of

#: the module's hooks recorded (fit's, the loaders, the checkpoint hooks) and the callback's
HOOKS = ("configure_callbacks", "prepare_data", "setup", "configure_model", "configure_optimizers", "zero_grad",
         "train_dataloader", "val_dataloader", "on_fit_start", "on_train_start", "on_train_epoch_start",
         "on_train_epoch_end", "on_validation_start", "on_validation_end", "on_save_checkpoint",
         "on_load_checkpoint", "on_train_end", "on_fit_end", "teardown")
CALLBACK_HOOKS = ("setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
                  "on_train_epoch_start", "on_train_epoch_end", "on_validation_start", "on_validation_end",
                  "state_dict", "load_state_dict", "on_save_checkpoint", "on_load_checkpoint", "on_train_end",
                  "on_fit_end", "teardown")


def _frameworks():
    import lightning
    import taskfit.lightning

    return {"lightning": lightning, "taskfit": taskfit.lightning}


def _kind(x):
    if isinstance(x, dict):  # a checkpoint dict: its keys, epoch and step (values differ in kind by framework)
        return (tuple(sorted(x)), x.get("epoch"), x.get("global_step"))
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    return "module" if isinstance(x, torch.nn.Module) else type(x).__name__


def _wrap(obj, names, calls, prefix=""):
    def call(name, fn, *args, **kwargs):
        out = fn(*args, **kwargs)
        shown = [a for a in args if not hasattr(a, "fit_loop") and type(a).__name__ != "Trainer"
                 and not isinstance(a, torch.nn.Module)]
        calls.append((prefix + name, tuple(_kind(a) for a in shown), tuple(sorted(kwargs))))
        return out

    for name in names:
        bound = getattr(obj, name)
        setattr(obj, name, functools.update_wrapper(functools.partial(call, name, bound), bound))


def _hooked(L, calls, seen=None):
    """A module with its own loaders, a callback with a state; the module's ``on_save_checkpoint`` adds a key of
    its own and its ``on_load_checkpoint`` notes what it receives in ``seen``."""
    class Hooked(linear(L.LightningModule)):
        def prepare_data(self):  # overridden so that Lightning calls it (as in its own test)
            pass

        def configure_model(self):
            pass

        def train_dataloader(self):
            return data(n=12, batch_size=4)

        def val_dataloader(self):
            return data(n=8, batch_size=4, seed=1)

        def validation_step(self, batch, batch_idx):
            self.log("v", self.layer(batch[0]).sum())

        def on_save_checkpoint(self, checkpoint):
            checkpoint["mine"] = {"step": checkpoint["global_step"], "w": self.layer.weight.detach().clone()}

        def on_load_checkpoint(self, checkpoint):
            if seen is not None:
                seen.update(mine=checkpoint["mine"], epoch=checkpoint["epoch"], step=checkpoint["global_step"],
                            weights=checkpoint["state_dict"]["layer.weight"].clone(),
                            optimizers=len(checkpoint["optimizer_states"]), callbacks=sorted(checkpoint["callbacks"]))

    class Stateful(L.Callback):
        def state_dict(self):
            return {"foo": True}

        def load_state_dict(self, state_dict):
            calls.append(("loaded", tuple(sorted(state_dict.items())), ()))

    torch.manual_seed(0)
    module = Hooked()
    _wrap(module, HOOKS, calls)
    cb = Stateful()
    _wrap(cb, CALLBACK_HOOKS, calls, "Callback.")
    return module, cb


def _trainer(L, root, callbacks, **flags):
    return L.Trainer(default_root_dir=str(root), accelerator="cpu", devices=1, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks), **flags)


def _fit(trainer, module, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, **kwargs)


def test_F_LIT_DOOR_fit_hook_order_and_checkpoint_dict_match_lightning(tmp_path):
    """fit with the sanity check and a ModelCheckpoint: the loaders are asked for where Lightning asks
    (``val_dataloader`` inside the sanity check, ``train_dataloader`` after it, both after
    ``configure_optimizers``), the checkpoint is saved after ``on_train_epoch_end`` with ``state_dict`` called
    once, and ``on_save_checkpoint`` receives Lightning's dict (keys, epoch, step); ``zero_grad`` before each
    validation of the fit (not overridden: Lightning's default ``on_validation_model_zero_grad``); the weights
    are equal."""
    seqs, weights = {}, {}
    for name, L in _frameworks().items():
        calls = []
        module, cb = _hooked(L, calls)
        _fit(_trainer(L, tmp_path / name, [cb], max_epochs=1, limit_val_batches=2, num_sanity_val_steps=1), module)
        seqs[name], weights[name] = calls, module.layer.weight.detach().clone()
    assert seqs["taskfit"] == seqs["lightning"]
    names = [c[0] for c in seqs["taskfit"]]
    assert names.index("configure_optimizers") < names.index("Callback.on_sanity_check_start") \
        < names.index("val_dataloader") < names.index("Callback.on_sanity_check_end") \
        < names.index("train_dataloader") < names.index("Callback.on_train_start")
    saved = [c for c in seqs["taskfit"] if c[0] == "on_save_checkpoint"]
    assert saved == [("on_save_checkpoint", ((("callbacks", "epoch", "global_step", "loops", "lr_schedulers", "mine",
                                               "optimizer_states", "pytorch-lightning_version", "state_dict"),
                                              0, 3),), ())]  # "mine": added by the hook itself
    torch.testing.assert_close(weights["taskfit"], weights["lightning"], rtol=0, atol=0)


def test_F_LIT_DOOR_resume_restores_before_configure_optimizers_and_keeps_added_keys(tmp_path):
    """A run stopped by ``max_steps`` mid-epoch resumes with more steps: the weights, ``on_load_checkpoint``
    (module, then callback) and the callback's ``load_state_dict`` come right after ``configure_model``, before
    ``configure_optimizers``; the dict holds Lightning's keys plus the key the module added when saving; the epoch
    continues at its next batch without ``on_train_epoch_start`` again; calls as Lightning's. The data of that
    batch differs on purpose: Lightning replays a plain loader from its first batch (batch_idx 1 gets batch 0's
    data), taskfit skips what was trained, so its weights equal an uninterrupted run's."""
    seqs, seen, weights = {}, {}, {}
    for name, L in _frameworks().items():
        first, first_cb = _hooked(L, [])
        trainer = _trainer(L, tmp_path / name, [first_cb], max_steps=1, limit_val_batches=0)
        _fit(trainer, first)
        path = trainer.checkpoint_callback.best_model_path
        weights["saved"] = first.layer.weight.detach().clone()
        calls, seen[name] = [], {}
        module, cb = _hooked(L, calls, seen[name])
        _fit(_trainer(L, tmp_path / name, [cb], max_steps=3, limit_val_batches=0), module, ckpt_path=path)
        seqs[name], weights[name] = calls, module.layer.weight.detach().clone()
    assert seqs["taskfit"] == seqs["lightning"]
    names = [c[0] for c in seqs["taskfit"]]
    assert names[names.index("configure_model") + 1:names.index("configure_optimizers")] == [
        "on_load_checkpoint", "Callback.on_load_checkpoint", "loaded", "Callback.load_state_dict"]
    assert "on_train_epoch_start" not in names
    t, lt = seen["taskfit"], seen["lightning"]
    assert (t["epoch"], t["step"], t["mine"]["step"], t["optimizers"]) == (lt["epoch"], lt["step"],
                                                                           lt["mine"]["step"], lt["optimizers"])
    assert len(t["callbacks"]) == len(lt["callbacks"]) == 2  # ours and the ModelCheckpoint
    torch.testing.assert_close(t["mine"]["w"], lt["mine"]["w"], rtol=0, atol=0)
    torch.testing.assert_close(t["weights"], lt["weights"], rtol=0, atol=0)  # the saved weights, as saved
    torch.testing.assert_close(t["weights"], weights["saved"], rtol=0, atol=0)
    import taskfit.lightning

    whole, _ = _hooked(taskfit.lightning, [])
    _fit(_trainer(taskfit.lightning, tmp_path / "whole", [], max_steps=3, limit_val_batches=0), whole)
    torch.testing.assert_close(weights["taskfit"], whole.layer.weight.detach(), rtol=0, atol=0)


def test_F_LIT_DOOR_estimated_stepping_batches_in_configure_optimizers(tmp_path):
    """``self.trainer.estimated_stepping_batches`` read in ``configure_optimizers`` (before any loader was asked
    for) asks for the train loader there, as Lightning: a ``OneCycleLR`` over it gives the same learning rates
    and weights, ``train_dataloader`` is called once."""
    out = {}
    for name, L in _frameworks().items():
        calls = []

        class Cycled(linear(L.LightningModule)):
            def train_dataloader(self):
                calls.append("train_dataloader")
                return data(n=16, batch_size=4)

            def configure_optimizers(self):
                calls.append(("total", self.trainer.estimated_stepping_batches))
                opt = torch.optim.SGD(self.parameters(), lr=0.1)
                sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1,
                                                            total_steps=self.trainer.estimated_stepping_batches)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        torch.manual_seed(0)
        module = Cycled()
        _fit(_trainer(L, tmp_path / name, [], max_epochs=2, enable_checkpointing=False), module)
        out[name] = (calls, module.layer.weight.detach().clone())
    assert out["taskfit"][0] == out["lightning"][0] == ["train_dataloader", ("total", 8)]
    torch.testing.assert_close(out["taskfit"][1], out["lightning"][1], rtol=0, atol=0)


def test_F_LIT_CKPT_checkpoint_frequency_with_val_check_interval(tmp_path):
    """``ModelCheckpoint`` saves after every validation (``val_check_interval=0.25``: four per epoch) and keeps the
    top ``k`` of a monitored value: the same checkpoint names as Lightning's (Lightning's own
    test_checkpoint_callback_frequency.py counts its ``torch.save`` calls, which a checkpoint folder cannot match)."""
    import os

    names = {}
    for name, L in _frameworks().items():
        class Logged(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("my_loss", loss.detach())
                return loss

            def validation_step(self, batch, batch_idx):
                self.log("v", self.layer(batch[0]).sum())

        torch.manual_seed(0)
        root = tmp_path / name
        cbs = callbacks_of(L)
        every = cbs.ModelCheckpoint(dirpath=str(root / "all"), save_top_k=-1)
        top = cbs.ModelCheckpoint(dirpath=str(root / "top"), monitor="my_loss", save_top_k=2)
        trainer = _trainer(L, root, [every, top], max_epochs=1, val_check_interval=0.25, limit_val_batches=1,
                           num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Logged(), data(n=16, batch_size=2), data(n=8, batch_size=4, seed=1))
        names[name] = {d: sorted(os.listdir(root / d)) for d in ("all", "top")}
    assert names["taskfit"] == names["lightning"]
    assert len(names["taskfit"]["all"]) == 4 and len(names["taskfit"]["top"]) == 2
