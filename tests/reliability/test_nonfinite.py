"""Non-finite training stops (F-REL-5): a loss that is NaN from step 1, or from a later step, stops the run with
``NonFiniteError`` naming the step, detected on the first logging or save step (no per-step host sync), and no
checkpoint holding non-finite weights is ever written, so the newest complete checkpoint is always finite."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from taskfit import Fit
from taskfit.loops.finite import NonFiniteError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


class NaNFrom(job.Net):
    """The job's regression net whose loss turns NaN from optimizer step ``start`` on."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.fit.state.global_step + 1 >= self.start else loss


def _fit(out: Path, **kw) -> Fit:
    base = dict(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
                disable_tqdm=True, seed=3, max_steps=12)
    return Fit(**{**base, **kw})


def _complete(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "manifest.json").exists())


def test_F_REL_5_nan_loss_from_step_1_stops_at_the_first_logging_step(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match=r"global step 2: parameter 'body\.\d\.\w+' holds NaN"):
        _fit(tmp_path / "out", logging_steps=2, save_steps=3).fit(NaNFrom(1), job.data())
    assert _complete(tmp_path / "out") == []


@pytest.mark.parametrize("nan_filter", [True, False])
def test_F_REL_5_nan_after_a_save_keeps_the_finite_checkpoint_newest(tmp_path, nan_filter):
    out = tmp_path / "out"
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match=r"global step 6:.*newest complete checkpoint is .*checkpoint-3"):
        _fit(out, logging_steps=100, save_steps=3, logging_nan_inf_filter=nan_filter).fit(NaNFrom(5), job.data())
    assert _complete(out) == [3]
    weights = load_file(out / "checkpoint-3" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_F_REL_5_async_saves_never_complete_a_non_finite_checkpoint(tmp_path):
    out = tmp_path / "out"
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match="global step 4"):
        _fit(out, logging_steps=100, save_steps=2, checkpoint_io="async").fit(NaNFrom(3), job.data())
    assert _complete(out) == [2]


def test_F_REL_5_nan_with_no_logging_or_save_step_left_still_stops_at_the_end(tmp_path):
    """NaN from step 1, logging past the end, no saves: no logging or save step ever checks the weights, so the
    end of ``fit`` does (once per run), and ``save_model`` refuses to write non-finite weights."""
    out = tmp_path / "out"
    torch.manual_seed(0)
    fit = _fit(out, logging_steps=1000, save_strategy="no")
    with pytest.raises(NonFiniteError, match=r"Training stopped at global step 12: parameter 'body\.\d\.\w+'"):
        fit.fit(NaNFrom(1), job.data())
    with pytest.raises(NonFiniteError, match=r"save_model refused at global step 12"):
        fit.save_model(str(tmp_path / "final"))
    assert not (tmp_path / "final" / "model.safetensors").exists()


def test_F_REL_5_finite_run_with_no_logging_step_ends_normally(tmp_path):
    torch.manual_seed(0)
    fit = _fit(tmp_path / "out", logging_steps=1000, save_strategy="no")
    fit.fit(job.Net(), job.data())
    assert fit.state.global_step == 12
    fit.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "model.safetensors").exists()
