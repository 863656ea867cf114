"""Lightning's own ``summarize`` / ``ModelSummary`` utility (``lightning.pytorch.utilities.model_summary``) on the
same module written on ``lightning.LightningModule`` and on ``taskfit.lightning.LightningModule`` (F-LIT-6): with an
``example_input_array`` it runs the input through the module's batch-transfer hooks (``on_before_batch_transfer``,
``transfer_batch_to_device``, ``on_after_batch_transfer``) and reports equal layer names, input and output sizes,
parameter counts and training modes."""

from __future__ import annotations

import torch
from two_doors import frameworks


def _make(L):
    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU())
            self.head = torch.nn.Linear(4, 2)
            self.example_input_array = torch.zeros(3, 5)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            return torch.cat([batch, torch.ones(batch.shape[0], 1)], dim=1)  # 5 -> 6 features

        def on_after_batch_transfer(self, batch, dataloader_idx):
            return batch[:2]  # 3 -> 2 rows

        def forward(self, x):
            return self.head(self.encoder(x))

    return Net


def test_F_LIT_6_lightning_summarize_on_door_modules():
    from lightning.pytorch.utilities.model_summary import summarize

    seen = {}
    for name, L in frameworks().items():
        torch.manual_seed(0)
        model = _make(L)()
        model.head.eval()
        summary = summarize(model, max_depth=2)
        seen[name] = (summary.layer_names, summary.in_sizes, summary.out_sizes, summary.param_nums,
                      summary.training_modes, summary.total_parameters, model.head.training, model.training)
    assert seen["taskfit"] == seen["lightning"]
    assert seen["taskfit"][:3] == (["encoder", "encoder.0", "encoder.1", "head"], [[2, 6], [2, 6], [2, 4], [2, 4]],
                                   [[2, 4], [2, 4], [2, 4], [2, 2]])
    assert seen["taskfit"][6:] == (False, True)  # the modes are put back after the example forward
