"""``sync_dist`` defaults (a documented difference from Lightning): epoch values logged during evaluation are
reduced over processes unless ``sync_dist=False``; training values only with ``sync_dist=True``. The reduction
runs at the end of the epoch, once per name, never per step. One process with a recording reduce function (the
real collectives are exercised in test_lightning_distributed.py)."""

import inspect

import pytest
import torch

from taskfit.core.module import infer_batch_size
from taskfit.core.results import ResultCollection


class Recorder:
    """Stands in for ``strategy.reduce`` of a 2-process run whose other rank logged ``other`` (value, weight)."""

    def __init__(self, other=(0.0, 0)):
        self.calls, self.other = [], other

    def __call__(self, tensor, op):
        self.calls.append(op)
        if tensor.numel() == 2:  # [weighted sum, weight] of a mean
            return tensor + torch.tensor([self.other[0] * self.other[1], self.other[1]], dtype=tensor.dtype)
        return tensor


def _log_batches(results, name, values, sizes, **kw):
    for v, n in zip(values, sizes):
        results.set_batch(torch.zeros(n, 2))
        results.log(name, torch.tensor(v), on_step=False, on_epoch=True, prog_bar=False, logger=True,
                    reduce_fx="mean", batch_size=None, **kw)


def test_F_OBS_6_lightning_defaults_to_no_sync_taskfit_syncs_evaluation_values():
    import lightning as L

    from taskfit import TaskModule

    assert inspect.signature(L.LightningModule.log).parameters["sync_dist"].default is False
    assert inspect.signature(TaskModule.log).parameters["sync_dist"].default is None  # None: on in evaluation


@pytest.mark.parametrize("sync_dist, expected", [(None, (0.8 * 5 + 0.9 * 4 + 0.95 * 9) / 18), (True, None),
                                                 (False, (0.8 * 5 + 0.9 * 4) / 9)])
def test_F_OBS_6_evaluation_epoch_values_reduce_weighted_by_batch_size_at_epoch_end(sync_dist, expected):
    reduce = Recorder(other=(0.95, 9))  # the other rank: 9 samples with mean 0.95
    results = ResultCollection(infer_batch_size, reduce, sync_by_default=True)
    _log_batches(results, "val_acc", [0.8, 0.9], [5, 4], sync_dist=sync_dist)
    assert reduce.calls == []  # nothing per step
    value = results.epoch_values()["val_acc"]
    expected = expected if expected is not None else (0.8 * 5 + 0.9 * 4 + 0.95 * 9) / 18
    assert value == pytest.approx(expected, rel=1e-6)  # float32 inputs
    assert reduce.calls == ([] if sync_dist is False else ["sum"])  # one all-reduce of [sum, weight]


def test_F_OBS_6_training_values_sync_only_when_asked():
    reduce = Recorder(other=(1.0, 4))
    results = ResultCollection(infer_batch_size, reduce)  # training: sync_by_default=False
    _log_batches(results, "acc", [0.5], [4], sync_dist=None)
    assert results.epoch_values()["acc"] == 0.5 and reduce.calls == []
    _log_batches(results, "acc_synced", [0.5], [4], sync_dist=True)
    assert results.epoch_values()["acc_synced"] == pytest.approx(0.75) and reduce.calls == ["sum"]
