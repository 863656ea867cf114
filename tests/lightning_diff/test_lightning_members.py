"""Differential tests against Lightning: LightningModule members on a TaskModule (scenarios after Lightning's
tests_pytorch/models/test_hparams.py, trainer/optimization/test_optimizers.py, models/test_hooks.py)."""

import json

import pytest
import torch
from torch.nn import functional as F

from harness import data, run_lightning, run_taskfit, same_weights


def regressor(configure=None, record=None):
    def make(base):
        class Regressor(base):
            def __init__(self, hidden=3, lr=0.1, note="x"):
                super().__init__()
                self.save_hyperparameters(ignore="note")
                self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
                self.seen = []
                self.example_input_array = torch.zeros(2, 4)

            def forward(self, x):
                return self.net(x)

            def training_step(self, batch, batch_idx):
                x, y = batch
                if record:
                    self.seen.append(record(self))
                return F.mse_loss(self(x), y)

            def configure_optimizers(self):
                if configure:
                    return configure(self)
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return Regressor
    return make


SCENARIOS = {
    "sgd_two_epochs": (regressor(), dict(max_epochs=2)),
    "adam_accumulate_2": (regressor(lambda m: torch.optim.Adam(m.parameters(), lr=0.01)),
                          dict(max_epochs=2, accumulate_grad_batches=2)),
    "clip_norm": (regressor(), dict(max_epochs=2, gradient_clip_val=0.05)),
    "return_list": (regressor(lambda m: [torch.optim.SGD(m.parameters(), lr=0.05)]), dict(max_epochs=1)),
    "max_steps": (regressor(), dict(max_epochs=5, max_steps=6)),
    "onecycle_estimated_batches": (regressor(lambda m: {
        "optimizer": (o := torch.optim.SGD(m.parameters(), lr=0.1)),
        "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=0.2, total_steps=m.trainer.estimated_stepping_batches), "interval": "step"}}),
        dict(max_epochs=3)),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_F_CORE_1_lightning_module_trains_to_the_same_weights(name, tmp_path):
    """The same module body under lightning.Trainer and Fit ends with bit-equal fp32 weights."""
    make, opts = SCENARIOS[name]
    a, _ = run_lightning(make, data(), **opts)
    b, _ = run_taskfit(make, data(), tmp_path=tmp_path, **opts)
    assert same_weights(a, b)


def test_F_CORE_1_trainer_view_members_match_lightning(tmp_path):
    """self.trainer's current_epoch, global_step, max_epochs, estimated_stepping_batches, num_training_batches and
    accumulate_grad_batches read the same inside training_step."""
    rec = lambda m: (m.trainer.current_epoch, m.trainer.global_step, m.current_epoch, m.global_step,  # noqa: E731
                     m.trainer.max_epochs, m.trainer.estimated_stepping_batches, m.trainer.num_training_batches,
                     m.trainer.accumulate_grad_batches, m.trainer.training)
    make = regressor(record=rec)
    a, _ = run_lightning(make, data(n=20), max_epochs=2, accumulate_grad_batches=2)
    b, _ = run_taskfit(make, data(n=20), tmp_path=tmp_path, max_epochs=2, accumulate_grad_batches=2)
    assert len(a.seen) == 10 and a.seen == b.seen


def test_F_CORE_1_hparams_dtype_example_input_and_loggers(tmp_path):
    """save_hyperparameters in __init__ (with ignore), hparams as attributes, dtype, example_input_array and
    logger/loggers read as in Lightning."""
    import lightning as L
    from taskfit import TaskModule

    for base in (L.LightningModule, TaskModule):
        m = regressor()(base)(hidden=5, lr=0.2, note="dropped")
        assert dict(m.hparams) == {"hidden": 5, "lr": 0.2} and m.hparams.lr == 0.2
        assert m.dtype == torch.float32 and m.double().dtype == torch.float64
        assert m.example_input_array.shape == (2, 4)
        assert m.logger is None and m.loggers == []
    _, fit = run_taskfit(regressor(), data(), tmp_path=tmp_path)
    assert fit.module.logger is None and fit.module.trainer.logger is None


def test_F_CORE_1_print_only_on_rank_zero(capsys):
    from taskfit import TaskModule

    m = regressor()(TaskModule)()
    m.print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"


def test_F_CORE_1_load_from_checkpoint_rebuilds_from_saved_hparams(tmp_path):
    """Train with checkpoints, then Regressor.load_from_checkpoint(path) (no constructor arguments) gives a module
    whose outputs equal the trained one's; map_location and strict work; kwargs override saved hparams."""
    from taskfit import TaskModule

    make = regressor()
    b, fit = run_taskfit(make, data(), tmp_path=tmp_path, max_epochs=2, init=dict(hidden=6, lr=0.05),
                         fit_options=dict(save_strategy="steps", save_steps=4))
    ckpt = tmp_path / "checkpoint-8"
    assert json.loads((ckpt / "config.json").read_text())["hyper_parameters"] == {"hidden": 6, "lr": 0.05}
    cls = type(b)
    loaded = cls.load_from_checkpoint(str(ckpt), map_location="cpu")
    assert isinstance(loaded, TaskModule) and dict(loaded.hparams) == {"hidden": 6, "lr": 0.05}
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(loaded(x), b.eval()(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        cls.load_from_checkpoint(str(ckpt), hidden=7)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        cls.load_from_checkpoint(str(tmp_path / "nowhere"))
