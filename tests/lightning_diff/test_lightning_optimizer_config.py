"""Differential tests against Lightning: how ``configure_optimizers``' result is read (scenarios after Lightning's
tests_pytorch/trainer/optimization/test_optimizers.py and test_manual_optimization.py): the refusals and warnings
with Lightning's words, before any training step, and the scheduler configs ``trainer.lr_scheduler_configs`` holds
(equal to Lightning's ``LRSchedulerConfig``)."""

import pytest
import torch
from torch.optim import lr_scheduler as S

from harness import data, run_lightning


def _module(configure, base, manual=False, optimizer_idx=False):
    torch.manual_seed(0)
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.automatic_optimization = not manual
            self.steps = 0

        if optimizer_idx:
            def training_step(self, batch, batch_idx, optimizer_idx):
                raise AssertionError("never called")
        else:
            def training_step(self, batch, batch_idx):
                self.steps += 1
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.layer(x), y)
                self.log("loss_", loss)
                if not self.automatic_optimization:
                    opt = self.optimizers()
                    opt.zero_grad()
                    self.manual_backward(loss, retain_graph=True)  # kwargs reach Tensor.backward (Lightning)
                    opt.step()
                    return None
                return loss

        def configure_optimizers(self):
            return configure(self)
    return Net()


def _taskfit(configure, tmp_path, **kw):
    import taskfit.lightning as TL

    m = _module(configure, TL.LightningModule, **kw)
    t = TL.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(tmp_path))
    t.fit(m, data())
    return m, t


def _lightning(configure, **kw):
    import lightning as L

    m = _module(configure, L.LightningModule, **kw)
    t = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=None)
    t.fit(m, data())
    return m, t


def _sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1)


REFUSED = {
    "unknown_form": (lambda m: 1, "Unknown configuration for model optimizers"),
    "dict_and_optimizer_mixed": (lambda m: [{"optimizer": _sgd(m)}, _sgd(m)], "Unknown configuration"),
    "no_scheduler_key": (lambda m: {"optimizer": _sgd(m), "lr_scheduler": {}},
                         'The lr scheduler dict must have the key "scheduler"'),
    "plateau_without_monitor": (lambda m: (lambda o: ([o], [S.ReduceLROnPlateau(o)]))(_sgd(m)),
                                "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau`"),
    "plateau_dict_without_monitor": (lambda m: (lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": S.ReduceLROnPlateau(o)}})(_sgd(m)), "must include a monitor when a `ReduceLROnPlateau`"),
    "scheduler_of_another_optimizer": (lambda m: ([_sgd(m)], [S.StepLR(_sgd(m), 1)]),
                                       "attached with an optimizer that wasn't returned"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_F_LOOP_5_configure_optimizers_refusals_match_lightning(case, tmp_path):
    """Each bad result is refused before the first training step, with Lightning's message (Lightning:
    MisconfigurationException; taskfit: ValueError or TypeError)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    configure, match = REFUSED[case]
    with pytest.raises(MisconfigurationException, match=match):
        _lightning(configure)
    with pytest.raises((ValueError, TypeError), match=match):
        _taskfit(configure, tmp_path)


def test_F_LOOP_5_optimizer_idx_and_missing_state_dict_refused_like_lightning(tmp_path):
    for run in (_lightning, lambda c, **kw: _taskfit(c, tmp_path, **kw)):
        with pytest.raises(RuntimeError, match="Remove the `optimizer_idx` argument from `training_step`"):
            run(_sgd, optimizer_idx=True)

    class NoState:
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self):
            pass

    for run in (_lightning, lambda c, **kw: _taskfit(c, tmp_path, **kw)):
        with pytest.raises(TypeError, match="provided lr scheduler `NoState` is invalid"):
            run(lambda m: (lambda o: {"optimizer": o, "lr_scheduler": NoState(o)})(_sgd(m)))


def test_F_LOOP_5_scheduler_configs_equal_lightnings(tmp_path):
    """``trainer.lr_scheduler_configs`` equals Lightning's ``LRSchedulerConfig`` field by field (plateau with the
    dict's ``monitor``, ``interval="epoch"``, ``frequency=1``, ``strict=True``)."""
    from lightning.pytorch.utilities.types import LRSchedulerConfig

    def configure(m):
        o = torch.optim.Adam(m.parameters())
        return {"optimizer": o, "lr_scheduler": S.ReduceLROnPlateau(o), "monitor": "loss_"}

    _, a = _lightning(configure)
    _, b = _taskfit(configure, tmp_path)
    for t in (a, b):
        cfg = t.lr_scheduler_configs[0]
        assert cfg == LRSchedulerConfig(scheduler=cfg.scheduler, monitor="loss_", interval="epoch", frequency=1,
                                        reduce_on_plateau=True, strict=True, name=None)


def test_F_LOOP_5_manual_optimization_plateau_and_backward_kwargs(tmp_path):
    """Manual optimization: a ReduceLROnPlateau needs no monitor, a config's ``monitor``/``strict`` warn that they
    are ignored, and ``manual_backward(loss, retain_graph=True)`` passes the argument on; same weights."""
    def plateau(m):
        o = _sgd(m)
        return [o], [{"scheduler": S.ReduceLROnPlateau(o), "monitor": "loss_", "strict": True}]

    with pytest.warns(RuntimeWarning, match=r"contains the key\(s\) \['monitor', 'strict'\], but the keys will be"):
        a, _ = _lightning(plateau, manual=True)
    with pytest.warns(RuntimeWarning, match=r"contains the key\(s\) \['monitor', 'strict'\], but the keys will be"):
        b, t = _taskfit(plateau, tmp_path, manual=True)
    assert a.steps == b.steps == 4 and t.global_step == 4
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_F_LOOP_5_plateau_not_stepped_in_an_epoch_cut_short(tmp_path):
    """A ReduceLROnPlateau on a metric never logged: an epoch cut short by ``max_steps`` neither steps nor checks
    it; a complete epoch raises (Lightning: MisconfigurationException, taskfit: ValueError), same message."""
    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    import taskfit.lightning as TL

    def configure(m):
        o = _sgd(m)
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.ReduceLROnPlateau(o), "monitor": "giraffe"}}

    for pl, exc in ((L, MisconfigurationException), (TL, ValueError)):
        kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=str(tmp_path))
        m = _module(configure, pl.LightningModule)
        t = pl.Trainer(max_steps=1, **kw)
        t.fit(m, data())
        assert t.global_step == 1 and t.optimizers[0].param_groups[0]["lr"] == 0.1
        with pytest.raises(exc, match=r"ReduceLROnPlateau conditioned on metric .* which is not available\."):
            pl.Trainer(max_epochs=1, **kw).fit(_module(configure, pl.LightningModule), data())


def test_F_LOOP_5_configure_optimizers_none_trains_nothing_like_lightning(tmp_path):
    """``configure_optimizers`` returning None: Lightning's warning, the loop runs its steps and the weights stay
    (Lightning's ``_MockOptimizer``); ``Fit`` keeps building its default optimizer instead."""
    runs = []
    for run in (_lightning, lambda c: _taskfit(c, tmp_path)):
        with pytest.warns(UserWarning, match="will run with no optimizer"):
            m, t = run(lambda m: None)
        runs.append((m, t))
    torch.manual_seed(0)
    fresh = torch.nn.Linear(4, 1)
    for m, t in runs:
        assert m.steps == 4 and t.global_step == 4
        assert torch.equal(m.layer.weight, fresh.weight) and torch.equal(m.layer.bias, fresh.bias)
