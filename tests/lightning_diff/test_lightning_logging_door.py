"""What ``self.log`` leaves in ``trainer.logged_metrics``, ``trainer.callback_metrics``,
``trainer.progress_bar_metrics`` and the loggers under ``taskfit.lightning.Trainer``, equal to
``lightning.Trainer``'s for the same module (scenarios after Lightning's tests_pytorch/trainer/logging_/)."""

import warnings

import pytest
import torch

from harness import data, linear
from two_doors import frameworks


def _trainer(L, root, **kw):
    opts = dict(default_root_dir=str(root), max_epochs=2, logger=False, enable_checkpointing=False,
                enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0, accelerator="cpu",
                devices=1)
    opts.update(kw)
    return L.Trainer(**opts)


def _floats(d):
    return {k: float(v) for k, v in d.items()}


def _recorder(L):
    """A logger of ``L``'s kind keeping every ``log_metrics(metrics, step)`` call in ``.rows``."""
    if L.__name__ == "lightning":
        from lightning.pytorch.loggers import Logger
    else:
        from taskfit.loggers.logger import Logger

    class Recorder(Logger):
        def __init__(self):
            super().__init__()
            self.rows = []

        name = property(lambda self: "rec")
        version = property(lambda self: 0)
        experiment = property(lambda self: None)

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

    return Recorder()


def test_F_LIT_LOG_metric_dicts_hold_only_logged_values_like_lightning(tmp_path):
    """G16: no run rows (loss, learning_rate, epoch, runtimes...) in the metric dicts, tensors in
    ``logged_metrics``/``callback_metrics``, floats in ``progress_bar_metrics``; step values of validation reach
    ``logged_metrics`` but not ``callback_metrics``; every key and value as Lightning's."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                loss = super().training_step(batch, batch_idx)
                self.log("default", loss)
                self.log("l_e", loss, on_step=False, on_epoch=True)
                self.log("l_se", loss, on_step=True, on_epoch=True)
                self.log("p_s", loss, prog_bar=True, logger=False)
                self.log("p_se", loss, on_step=True, on_epoch=True, prog_bar=True, logger=False)
                return loss

            def validation_step(self, batch, batch_idx):
                out = self.layer(batch[0]).sum()
                self.log("b", out, on_step=True, on_epoch=True)
                self.log("c", out, prog_bar=True)

            def on_validation_epoch_end(self):
                self.log("g", torch.tensor(2.0))

        torch.manual_seed(0)
        trainer = _trainer(L, tmp_path / name, log_every_n_steps=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8), data(n=8, seed=1))
        assert all(isinstance(v, torch.Tensor) for v in trainer.logged_metrics.values())
        assert all(isinstance(v, torch.Tensor) for v in trainer.callback_metrics.values())
        assert all(isinstance(v, float) for v in trainer.progress_bar_metrics.values())
        got[name] = (_floats(trainer.logged_metrics), _floats(trainer.callback_metrics),
                     dict(trainer.progress_bar_metrics))
    for ours, theirs in zip(got["taskfit"], got["lightning"]):
        assert set(ours) == set(theirs)
        assert ours == pytest.approx(theirs, rel=1e-5)
    assert set(got["taskfit"][0]) == {"default", "l_e", "l_se_step", "l_se_epoch", "b_step", "b_epoch", "c", "g"}


def test_F_LIT_LOG_logger_rows_epoch_and_step_like_lightning(tmp_path):
    """The loggers get only what ``self.log`` wrote, with Lightning's ``epoch`` (an int) and step (0-based: a
    step's row at the step before it, an epoch's row at its last step); a value logged in ``on_train_start``
    is an epoch value of the first epoch (after Lightning's test_log_metrics_epoch_step_values and
    test_log_on_train_start)."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def on_train_start(self):
                self.log("start", 123.0)

            def training_step(self, batch, batch_idx):
                self.log("foo", 0.5, on_step=True, on_epoch=True)
                return super().training_step(batch, batch_idx)

        rec = _recorder(L)
        torch.manual_seed(0)
        trainer = _trainer(L, tmp_path / name, logger=rec, log_every_n_steps=1, limit_val_batches=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8, batch_size=4))
        got[name] = rec.rows
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][:3] == [(0, {"foo_step": 0.5, "epoch": 0}), (1, {"foo_step": 0.5, "epoch": 0}),
                                  (1, {"start": 123.0, "foo_epoch": 0.5, "epoch": 0})]


def test_F_LIT_LOG_callbacks_log_in_hooks_without_a_batch_like_lightning(tmp_path):
    """G17: a callback's own ``self.log`` (Lightning gives callbacks the module's) and ``pl_module.log`` in
    ``on_train_start``/``on_validation_start`` (no batch yet: weight 1), each hook with Lightning's defaults
    (epoch values in ``on_train_start``/``on_train_epoch_start``, step values in ``on_train_batch_end``, the last
    one logged reaching ``callback_metrics`` after the last batch)."""
    got = {}
    for name, L in frameworks().items():
        class Logs(L.Callback):
            def on_train_start(self, trainer, pl_module):
                self.log("on_train_start", 1.0)

            def on_train_epoch_start(self, trainer, pl_module):
                self.log("on_train_epoch_start", 2.0)

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.log("on_train_batch_end", float(batch_idx))

            def on_validation_start(self, trainer, pl_module):
                pl_module.log("on_validation_start", 4.0)

            def on_train_epoch_end(self, trainer, pl_module):
                self.log("on_train_epoch_end", 5.0)

        class M(linear(L.LightningModule)):
            def validation_step(self, batch, batch_idx):
                self.log("v", self.layer(batch[0]).sum())

        torch.manual_seed(0)
        trainer = _trainer(L, tmp_path / name, max_epochs=1, callbacks=[Logs()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=12), data(n=8, seed=1))
        got[name] = _floats(trainer.callback_metrics)
    assert got["taskfit"] == pytest.approx(got["lightning"], rel=1e-5)
    assert {k: got["taskfit"][k] for k in ("on_train_start", "on_train_epoch_start", "on_train_batch_end",
                                           "on_validation_start", "on_train_epoch_end")} == {
        "on_train_start": 1.0, "on_train_epoch_start": 2.0, "on_train_batch_end": 2.0, "on_validation_start": 4.0,
        "on_train_epoch_end": 5.0}


def test_F_LIT_LOG_results_per_loader_and_refusals_like_lightning(tmp_path):
    """``test`` over two loaders: a name logged with ``add_dataloader_idx=False`` is in its own loader's result
    only, suffixed names in theirs; no run rows (``_runtime``...) in the results. ``on_step=False,
    on_epoch=False`` is refused with Lightning's message."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def test_step(self, batch, batch_idx, dataloader_idx=0):
                self.log("common", 7.0)
                self.log(f"only_{dataloader_idx}", 1.0 + dataloader_idx, add_dataloader_idx=False)

        torch.manual_seed(0)
        trainer = _trainer(L, tmp_path / name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got[name] = trainer.test(M(), [data(n=8), data(n=4, seed=1)])
    assert got["taskfit"] == got["lightning"] == [{"common/dataloader_idx_0": 7.0, "only_0": 1.0},
                                                  {"common/dataloader_idx_1": 7.0, "only_1": 2.0}]

    import taskfit.lightning

    class Bad(linear(taskfit.lightning.LightningModule)):
        def training_step(self, batch, batch_idx):
            self.log("x", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"`self.log\(on_step=False, on_epoch=False\)` is not useful"):
        _trainer(taskfit.lightning, tmp_path / "bad", max_epochs=1).fit(Bad(), data(n=4))


def test_F_LIT_LOG_epoch_end_value_apart_from_the_step_value_like_lightning(tmp_path):
    """G11: a name logged in ``training_step`` and again in ``on_train_epoch_end`` is two values (Lightning keys
    by hook and name): the epoch-end one is written last, the step one is left as it was (after Lightning's
    test_on_train_epoch_end_metrics_collection)."""
    got = {}
    for name, L in frameworks().items():
        class M(linear(L.LightningModule)):
            def training_step(self, batch, batch_idx):
                self.log_dict({"step_metric": torch.tensor(-1.0), "shared": 100.0}, logger=False, prog_bar=True)
                return super().training_step(batch, batch_idx)

            def on_train_epoch_end(self):
                self.log_dict({f"epoch_{self.current_epoch}": float(self.current_epoch), "shared": 111.0},
                              logger=False, prog_bar=True)

        torch.manual_seed(0)
        trainer = _trainer(L, tmp_path / name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(M(), data(n=8))
        got[name] = (dict(trainer.progress_bar_metrics), _floats(trainer.callback_metrics))
    assert got["taskfit"] == got["lightning"]
    assert got["taskfit"][0] == {"step_metric": -1.0, "shared": 111.0, "epoch_0": 0.0, "epoch_1": 1.0}
