"""Differential tests against Lightning: every configure_optimizers form with Lightning's scheduler semantics
(scenarios after Lightning's tests_pytorch/trainer/optimization/test_optimizers.py): the learning rate used by
every training step and the final weights are equal."""


import pytest
import torch
from torch.nn import functional as F
from torch.optim import lr_scheduler as S

from harness import data, linear, run_lightning, run_taskfit, same_weights


def module(configure, log_train=None, validate=False):
    def make(base):
        class Net(linear(base)):
            def __init__(self):
                super().__init__()
                self.lrs = []

            def training_step(self, batch, batch_idx):
                self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
                x, y = batch
                loss = F.mse_loss(self.layer(x), y)
                if log_train:
                    self.log("train_loss", loss, **log_train)
                return loss

            def configure_optimizers(self):
                return configure(self)

            if validate:
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.log("val_loss", F.mse_loss(self.layer(x), y))
        return Net
    return make


def sgd(m, lr=0.1):
    return torch.optim.SGD(m.parameters(), lr=lr)


def with_sched(build, form):
    def configure(m):
        opt = sgd(m)
        sched = build(opt)
        if form == "tuple":
            return [opt], [sched]
        if form == "dict":
            return {"optimizer": opt, "lr_scheduler": sched}
        if form == "list_of_dicts":
            return [{"optimizer": opt, "lr_scheduler": sched}]
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, **form}}
    return configure


step_lr = lambda o: S.StepLR(o, step_size=1, gamma=0.5)  # noqa: E731
SCENARIOS = {
    "optimizer_only": (sgd, {}),
    "tuple_steps_per_epoch": (with_sched(step_lr, "tuple"), dict(max_epochs=3)),
    "dict_steps_per_epoch": (with_sched(step_lr, "dict"), dict(max_epochs=3)),
    "list_of_dicts": (with_sched(step_lr, "list_of_dicts"), dict(max_epochs=3)),
    "interval_step": (with_sched(step_lr, {"interval": "step"}), dict(max_epochs=2)),
    "interval_step_frequency_3": (with_sched(step_lr, {"interval": "step", "frequency": 3}), dict(max_epochs=2)),
    "interval_epoch_frequency_2": (with_sched(step_lr, {"interval": "epoch", "frequency": 2}), dict(max_epochs=5)),
    "step_with_accumulation": (with_sched(step_lr, {"interval": "step"}),
                               dict(max_epochs=2, accumulate_grad_batches=2)),
    "exponential_tuple": (with_sched(lambda o: S.ExponentialLR(o, 0.7), "tuple"), dict(max_epochs=3)),
    "lambda_warmup_step": (with_sched(lambda o: S.LambdaLR(o, lambda s: min(1.0, (s + 1) / 3)),
                                      {"interval": "step", "name": "warmup"}), dict(max_epochs=2)),
    "two_schedulers_one_optimizer": (lambda m: ([o := sgd(m)], [S.StepLR(o, 2, 0.5), S.ExponentialLR(o, 0.9)]),
                                     dict(max_epochs=4)),
    "multistep_milestones": (with_sched(lambda o: S.MultiStepLR(o, [2, 5], 0.1), {"interval": "step"}),
                             dict(max_epochs=2)),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_F_LOOP_5_scheduler_forms_match_lightning_per_step(name, tmp_path):
    configure, opts = SCENARIOS[name]
    make = module(configure)
    a, _ = run_lightning(make, data(), **opts)
    b, _ = run_taskfit(make, data(), tmp_path=tmp_path, **opts)
    assert len(a.lrs) >= 4 and a.lrs == b.lrs
    assert same_weights(a, b)


def plateau(monitor=None, interval="epoch", strict=True):
    def configure(m):
        opt = sgd(m)
        sched = S.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0)  # every epoch counts as "no gain"
        cfg = {"scheduler": sched, "interval": interval, "strict": strict}
        if monitor:
            cfg["monitor"] = monitor
        return {"optimizer": opt, "lr_scheduler": cfg}
    return configure


PLATEAU = {
    "train_metric_epoch": (plateau("train_loss"), dict(log_train=dict(on_step=False, on_epoch=True))),
    "train_metric_step_interval": (plateau("train_loss", "step"), dict(log_train=dict(on_step=True))),
    "val_metric": (plateau("val_loss"), dict(validate=True)),
    "train_metric_logger_false": (plateau("train_loss"),
                                  dict(log_train=dict(on_step=False, on_epoch=True, logger=False))),
}


@pytest.mark.parametrize("name", sorted(PLATEAU))
def test_F_LOOP_5_reduce_on_plateau_matches_lightning(name, tmp_path):
    """ReduceLROnPlateau on a training or validation metric steps where Lightning steps it."""
    configure, kw = PLATEAU[name]
    make = module(configure, **kw)
    val = data(n=8, seed=1) if kw.get("validate") else None
    a, _ = run_lightning(make, data(), val, max_epochs=3)
    b, _ = run_taskfit(make, data(), val, tmp_path=tmp_path, max_epochs=3)
    assert a.lrs == b.lrs and len(set(a.lrs)) > 1
    assert same_weights(a, b)


def test_F_LOOP_5_plateau_errors_like_lightning(tmp_path):
    """A missing monitor key in the config is refused before training; a monitored metric that is never logged
    raises with strict=True and warns and skips with strict=False, in both frameworks."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    for configure, exc in ((lambda m: (lambda o: ([o], [S.ReduceLROnPlateau(o)]))(sgd(m)), "monitor"),
                           (plateau("nowhere"), "not available")):
        with pytest.raises(MisconfigurationException, match=exc):
            run_lightning(module(configure), data())
        with pytest.raises((ValueError, KeyError), match=exc):
            run_taskfit(module(configure), data(), tmp_path=tmp_path)
    make = module(plateau("nowhere", strict=False))
    with pytest.warns(RuntimeWarning, match="strict is set to"):
        a, _ = run_lightning(make, data(), max_epochs=2, quiet=False)
    with pytest.warns(RuntimeWarning, match="strict is set to"):
        b, _ = run_taskfit(make, data(), tmp_path=tmp_path, max_epochs=2)
    assert a.lrs == b.lrs == [0.1] * 8


def test_F_LOOP_5_bad_scheduler_config_refused(tmp_path):
    for cfg, match in (({"interval": "batch"}, 'The "interval" key in lr scheduler dict must be "step" or "epoch"'),
                       ({"frequency": 0}, "frequency")):
        with pytest.raises(ValueError, match=match):
            run_taskfit(module(with_sched(step_lr, cfg)), data(), tmp_path=tmp_path)


def test_F_LOOP_5_unknown_scheduler_keys_warn_and_train_like_lightning(tmp_path):
    """Unknown keys of a scheduler config warn (Lightning's RuntimeWarning) and are dropped: the same lrs and
    weights as Lightning."""
    make = module(with_sched(step_lr, {"interval": "step", "bogus": 1}))
    with pytest.warns(RuntimeWarning, match="Found unsupported keys in the lr scheduler dict"):
        a, _ = run_lightning(make, data(), quiet=False)
    with pytest.warns(RuntimeWarning, match="Found unsupported keys in the lr scheduler dict"):
        b, _ = run_taskfit(make, data(), tmp_path=tmp_path)
    assert a.lrs == b.lrs == [0.1, 0.05, 0.025, 0.0125]
    assert same_weights(a, b)


def test_F_LOOP_5_fitarguments_schedule_keeps_hf_per_step_semantics(tmp_path):
    """Without configure_optimizers, FitArguments' linear schedule steps after every optimizer step (HF)."""
    make = module(lambda m: None)
    b, _ = run_taskfit(make, data(), tmp_path=tmp_path, max_epochs=2,
                       fit_options=dict(learning_rate=0.1, lr_scheduler_type="linear", optim="sgd"))
    assert b.lrs == pytest.approx([0.1 * (1 - s / 8) for s in range(8)])
