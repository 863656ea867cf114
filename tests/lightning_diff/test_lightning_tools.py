"""Differential tests against Lightning for the training tools: StochasticWeightAveraging (F-LIT-6: the averaged
weights and BatchNorm statistics after fit, resume mid-SWA) and GradientAccumulationScheduler (weights after a
schedule that changes at epoch boundaries)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from harness import linear, run_lightning, run_taskfit


def _loader(n: int = 16, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) * 0.5 + 1.0), batch_size=batch_size, shuffle=False)


def bn_net(schedule: bool = False):
    def make(base):
        class BNNet(base):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

            def forward(self, x):
                return self.body(x)

            def training_step(self, batch, batch_idx):
                return F.mse_loss(self(batch[0]), batch[1])

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
                if not schedule:
                    return opt
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)}
        return BNNet
    return make


def _state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("kwargs", [dict(swa_lrs=0.02, swa_epoch_start=0.5, annealing_epochs=2),
                                    dict(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=1,
                                         annealing_strategy="linear", schedule=True)])
def test_swa_weights_and_batchnorm_statistics_equal_lightnings_F_LIT_6(tmp_path, kwargs):
    from lightning.pytorch.callbacks import StochasticWeightAveraging as LitSWA
    from taskfit.callbacks import StochasticWeightAveraging

    kwargs = dict(kwargs)
    schedule = kwargs.pop("schedule", False)
    lit_swa = LitSWA(**kwargs)
    lit, _ = run_lightning(bn_net(schedule), _loader(), max_epochs=5, callbacks=[lit_swa])
    ours, fit = run_taskfit(bn_net(schedule), _loader(), tmp_path=tmp_path, max_epochs=5,
                            callbacks=[StochasticWeightAveraging(**kwargs)])
    a, b = _state(ours), _state(lit)
    assert a.keys() == b.keys()
    # the parameters are Lightning's average; the BatchNorm statistics its pass over the train data computed
    lit_average = dict(lit_swa._average_model.named_parameters())
    for k in a:
        expected = lit_average[k] if k in lit_average else b[k]
        torch.testing.assert_close(a[k], expected.detach(), rtol=1e-6, atol=1e-6, msg=k)
    # documented difference: Lightning 2.6.6 steps the optimizer once more at the end of its BatchNorm epoch
    # (stale gradients and momentum), so its module ends slightly off the average; taskfit's is the average
    assert not torch.equal(dict(lit.named_parameters())["body.3.weight"], lit_average["body.3.weight"])
    assert fit.state.global_step == 20  # the BatchNorm pass steps nothing
    fit.save_model(str(tmp_path / "export"))
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "export" / "model.safetensors"))
    torch.testing.assert_close(saved["body.0.weight"], ours.body[0].weight.detach())


def test_swa_resume_mid_average_is_exact_F_LIT_6(tmp_path):
    from taskfit.callbacks import StochasticWeightAveraging

    def swa():
        return StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2, annealing_epochs=2)

    full, _ = run_taskfit(bn_net(True), _loader(), tmp_path=tmp_path / "a", max_epochs=5, callbacks=[swa()],
                          fit_options=dict(save_strategy="steps", save_steps=14))  # mid-epoch 3: SWA running
    resumed, fit = run_taskfit(bn_net(True), _loader(), tmp_path=tmp_path / "b", max_epochs=5, callbacks=[swa()],
                               fit_options=dict(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-14")))
    a, b = _state(full), _state(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_swa_bad_arguments_F_LIT_6():
    from taskfit.callbacks import StochasticWeightAveraging

    with pytest.raises(ValueError, match="swa_epoch_start=0"):
        StochasticWeightAveraging(0.1, swa_epoch_start=0)
    with pytest.raises(ValueError, match="annealing_strategy='exp'"):
        StochasticWeightAveraging(0.1, annealing_strategy="exp")
    with pytest.raises(ValueError, match="swa_lrs=-1"):
        StochasticWeightAveraging(-1)


def test_gradient_accumulation_schedule_weights_equal_lightnings_F_LIT_6(tmp_path):
    from lightning.pytorch.callbacks import GradientAccumulationScheduler as LitGAS
    from taskfit.callbacks import GradientAccumulationScheduler

    loader = _loader(n=32, batch_size=4)  # 8 batches: windows of 4 in epochs 0-1, of 2 from epoch 2
    lit, trainer = run_lightning(linear, loader, max_epochs=4, callbacks=[LitGAS({0: 4, 2: 2})])
    ours, fit = run_taskfit(linear, loader, tmp_path=tmp_path, max_epochs=4,
                            callbacks=[GradientAccumulationScheduler({0: 4, 2: 2})])
    assert fit.state.global_step == trainer.global_step == 2 + 2 + 4 + 4
    assert fit.state.max_steps == 12  # the plan counts each epoch's windows
    for a, b in zip(ours.parameters(), lit.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-7)


def test_gradient_accumulation_schedule_refusals_F_LIT_6(tmp_path):
    from taskfit import Fit, TaskModule
    from taskfit.callbacks import GradientAccumulationScheduler

    with pytest.raises(ValueError, match=r"Accumulation factor should be an int greater than 0. Got \[0\]"):
        GradientAccumulationScheduler({0: 0})  # Lightning's message
    with pytest.raises(TypeError, match="non-empty"):
        GradientAccumulationScheduler({})

    manual = linear(TaskModule)()
    manual.automatic_optimization = False
    fit = Fit(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no",
              callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(RuntimeError, match="manual optimization"):
        fit.fit(manual, _loader())
    fit = Fit(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, save_strategy="no",
              gradient_accumulation_steps=2, callbacks=[GradientAccumulationScheduler({0: 2})])
    with pytest.raises(ValueError, match="Either remove `accumulate_grad_batches`"):
        fit.fit(linear(TaskModule)(), _loader())
