"""What the differential tests of the Lightning door share: the two frameworks a script imports as ``L``
(``lightning`` and ``taskfit.lightning``), their ``callbacks`` modules, and the evaluation steps most scenarios add
to a module body."""

from __future__ import annotations

from collections.abc import Callable

from torch.nn import functional as F


def frameworks() -> dict:
    """``{"lightning": lightning, "taskfit": taskfit.lightning}``: the module a script imports as ``L``."""
    import lightning
    import taskfit.lightning

    return {"lightning": lightning, "taskfit": taskfit.lightning}


def callbacks_of(L) -> object:
    """The ``callbacks`` module of ``L`` (``lightning.pytorch.callbacks`` or ``taskfit.lightning.callbacks``)."""
    import lightning.pytorch.callbacks
    import taskfit.lightning.callbacks

    return lightning.pytorch.callbacks if L.__name__ == "lightning" else taskfit.lightning.callbacks


def with_evaluation(make_body: Callable[[type], type]) -> Callable[[type], type]:
    """``make_body`` plus ``validation_step`` logging ``val_loss`` (MSE) and ``test_step`` logging ``mae`` (L1) of
    ``self.layer`` on ``(x, y)`` batches."""
    def make(base: type) -> type:
        class Evaluated(make_body(base)):
            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val_loss", F.mse_loss(self.layer(x), y))

            def test_step(self, batch, batch_idx):
                x, y = batch
                self.log("mae", F.l1_loss(self.layer(x), y))
        return Evaluated
    return make
