"""What the streaming-resume tests and their DDP job share: the stream's samples and the regression module that
records which samples each step received. The job runs as a script from this folder, and pytest puts this folder on
``sys.path`` for the tests, so both import it as ``stream_common``."""

from __future__ import annotations

import torch
from taskfit import TaskModule
from torch import nn

N = 16  # samples in the whole stream


def stream_samples() -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``N`` inputs of 4 features (seed 1234) and their linear targets."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N, 4, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0])


# kept local: records which dict samples (``idx``) each step received
class Recorder(TaskModule):
    """Linear regression recording which samples (``batch["idx"]``) each step received."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["idx"].tolist())
        return nn.functional.mse_loss(self.layer(batch["x"]).squeeze(-1), batch["y"].float())
