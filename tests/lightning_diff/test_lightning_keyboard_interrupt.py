"""A ``KeyboardInterrupt`` inside ``trainer.fit`` (raised by a callback): Lightning's graceful shutdown under both
Trainers: the callbacks' ``on_exception`` runs, ``SystemExit(1)`` leaves ``fit``, ``trainer.interrupted`` and
``trainer.state.status`` say so, and the SIGINT handler is as before (Lightning ignores Ctrl-C during its shutdown,
then its tear-down puts the handler back)."""

import signal
import warnings

import pytest
import torch

from harness import data, linear
from two_doors import frameworks


@pytest.mark.parametrize("flags", [{"fast_dev_run": True}, {"max_steps": 2}], ids=["fast_dev_run", "max_steps"])
def test_F_LIT_STATE_keyboard_interrupt_exits_like_lightning(tmp_path, flags):
    """F-LIT-DOOR: exit code, state, ``interrupted``, the hooks seen and the SIGINT handler left, as Lightning's."""
    got = {}
    for name, L in frameworks().items():
        seen = []

        class Interrupt(L.Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                seen.append(("batch_start", batch_idx))
                if batch_idx == 1 or flags.get("fast_dev_run"):
                    raise KeyboardInterrupt

            def on_exception(self, trainer, pl_module, exception):
                seen.append(("on_exception", type(exception).__name__))

        trainer = L.Trainer(default_root_dir=str(tmp_path / name), accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[Interrupt()], **flags)
        torch.manual_seed(0)
        previous = signal.getsignal(signal.SIGINT)
        try:
            with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_info:
                warnings.simplefilter("ignore")
                trainer.fit(linear(L.LightningModule)(), data(n=8))
            kept = signal.getsignal(signal.SIGINT) is previous
        finally:
            signal.signal(signal.SIGINT, previous)
        got[name] = (exit_info.value.code, trainer.interrupted, str(trainer.state.status.value), seen, kept)
    assert got["taskfit"] == got["lightning"]
    assert got["lightning"][:3] == (1, True, "interrupted") and got["lightning"][4]
