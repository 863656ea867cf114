"""Differential tests against Lightning: manual optimization (scenarios after Lightning's
tests_pytorch/trainer/optimization/test_manual_optimization.py)."""

import pytest
import torch
from torch.nn import functional as F
from torch.optim import lr_scheduler as S

from harness import data, run_lightning, run_taskfit, same_weights


def gan(clip=None, closure=False, schedulers=True, step_every=1):
    def make(base):
        class GAN(base):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.g = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
                self.d = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
                self.lrs, self.grad_flags = [], []

            def training_step(self, batch, batch_idx):
                x, _ = batch
                z = x[:, :2] * 0.5
                opt_g, opt_d = self.optimizers()
                self.lrs.append((opt_g.param_groups[0]["lr"], opt_d.param_groups[0]["lr"]))

                self.toggle_optimizer(opt_d)
                self.grad_flags.append((all(p.requires_grad for p in self.d.parameters()),
                                        any(p.requires_grad for p in self.g.parameters())))
                fake = self.g(z).detach()
                d_loss = F.softplus(-self.d(x)).mean() + F.softplus(self.d(fake)).mean()
                self.manual_backward(d_loss)
                if clip:
                    self.clip_gradients(opt_d, gradient_clip_val=clip[0], gradient_clip_algorithm=clip[1])
                if (batch_idx + 1) % step_every == 0:
                    opt_d.step()
                    opt_d.zero_grad()
                self.untoggle_optimizer(opt_d)

                self.toggle_optimizer(opt_g)

                def g_closure():
                    g_loss = F.softplus(-self.d(self.g(z))).mean()
                    opt_g.zero_grad()
                    self.manual_backward(g_loss)
                    return g_loss

                if closure:
                    g_loss = opt_g.step(closure=g_closure)
                else:
                    g_loss = g_closure()
                    opt_g.step()
                self.untoggle_optimizer(opt_g)
                if schedulers and (batch_idx + 1) % 2 == 0:
                    for sch in self.lr_schedulers():
                        sch.step()
                self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

            def configure_optimizers(self):
                opt_g = torch.optim.Adam(self.g.parameters(), lr=0.01, betas=(0.5, 0.999))
                opt_d = torch.optim.SGD(self.d.parameters(), lr=0.05, momentum=0.9)
                if not schedulers:
                    return [opt_g, opt_d]
                return [opt_g, opt_d], [S.StepLR(opt_g, 1, 0.9), S.ExponentialLR(opt_d, 0.8)]
        return GAN
    return make


SCENARIOS = {
    "gan_two_optimizers_two_schedulers": gan(),
    "gan_clip_norm": gan(clip=(0.1, "norm")),
    "gan_clip_value": gan(clip=(0.01, "value")),
    "gan_closure": gan(closure=True),
    "gan_no_schedulers": gan(schedulers=False),
    "gan_accumulate_d_every_2": gan(step_every=2),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_F_CORE_1_manual_optimization_matches_lightning(name, tmp_path):
    """Two optimizers stepped by training_step (toggle/untoggle, manual_backward, clip_gradients, closures,
    self.lr_schedulers()) end with bit-equal weights and the same learning rates per step."""
    make = SCENARIOS[name]
    a, _ = run_lightning(make, data(n=24), max_epochs=2)
    b, fit = run_taskfit(make, data(n=24), tmp_path=tmp_path, max_epochs=2)
    assert same_weights(a, b)
    assert a.lrs == b.lrs and a.grad_flags == b.grad_flags == [(True, False)] * 12
    assert all(p.requires_grad for p in b.parameters())  # untoggled


def test_F_CORE_1_manual_optimization_refuses_accumulation(tmp_path):
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="accumulation"):
        run_lightning(gan(), data(), accumulate_grad_batches=2)
    with pytest.raises(ValueError, match="manual optimization"):
        run_taskfit(gan(), data(), tmp_path=tmp_path, accumulate_grad_batches=2)
