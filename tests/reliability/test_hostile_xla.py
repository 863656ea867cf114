"""No code runs when an XLA run loads a checkpoint (F-REL-3). ``XLAStrategy`` and ``XLAFSDPStrategy`` read
checkpoints with the code every strategy shares (``read_checkpoint`` -> ``Strategy.load_checkpoint`` and
``Strategy.load_checkpoint_shards``; asserted below: they override neither).

torch_xla is absent from the main environment (it pins its own torch), so the default-run tests exercise that
shared reader code directly through ``XLAStrategy``'s own methods on a stand-in that answers the PJRT topology
(one replica, CPU) without torch_xla; nothing else of the strategy is replaced. The ``xla``-marked test resumes a
real XLA run on the PJRT CPU device (``make test-xla``, in ``.venv-xla``) and skips elsewhere. In every case a file
whose unpickling would create a marker file is refused with an error naming it, and the marker never appears."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from lightning_utilities.core.imports import RequirementCache

_REAL_XLA = bool(RequirementCache(module="torch_xla")) and os.environ.get("PJRT_DEVICE", "").upper() == "CPU"
if _REAL_XLA:
    import torch_xla

    torch_xla.device()  # start the runtime before any eager backward (see tests/accelerators/test_xla_cpu.py)

from hostile import default_adamw, evil_pickle, evil_torch_file, replace_file  # noqa: E402

from taskfit import Fit  # noqa: E402
from taskfit.checkpoint.resume import read_checkpoint  # noqa: E402
from taskfit.accelerators.cpu import CPUAccelerator  # noqa: E402
from taskfit.io import UnsafeCheckpointError  # noqa: E402
from taskfit.precision.precision import Precision  # noqa: E402
from taskfit.strategies.strategy import Strategy  # noqa: E402
from taskfit.strategies.xla import XLAStrategy  # noqa: E402
from taskfit.strategies.xla_fsdp import XLAFSDPStrategy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402


class _XLAReaderOnCPU(XLAStrategy):
    """``XLAStrategy`` with the PJRT topology answered without torch_xla (one replica on the CPU)."""

    global_rank, local_rank, world_size = 0, 0, 1

    def __init__(self) -> None:  # XLAStrategy.__init__ requires torch_xla; the reading code does not
        Strategy.__init__(self, CPUAccelerator(), torch.device("cpu"), Precision())


def _checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    Fit(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, save_steps=2,
        report_to="none", disable_tqdm=True).fit(job.Net(), job.data())
    return tmp_path / "out" / "checkpoint-2"


def _load(ck: Path) -> None:
    model = job.Net()
    opt = default_adamw(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    read_checkpoint(_XLAReaderOnCPU(), str(ck), model, [opt], [sched])


def test_F_REL_3_xla_strategies_use_the_shared_checkpoint_reader():
    for cls in (XLAStrategy, XLAFSDPStrategy):
        assert cls.load_checkpoint is Strategy.load_checkpoint
        assert cls.load_checkpoint_shards is Strategy.load_checkpoint_shards


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "training_state.pt", "rng_state_0.pt"])
def test_F_REL_3_xla_reader_refuses_hostile_torch_files(name, tmp_path):
    ck, marker = _checkpoint(tmp_path), tmp_path / "pwned"
    _load(ck)  # the genuine checkpoint loads
    replace_file(ck, name, evil_torch_file(marker))
    with pytest.raises(UnsafeCheckpointError, match=name.replace(".", r"\.")):
        _load(ck)
    assert not marker.exists()


def test_F_REL_3_xla_reader_refuses_hostile_dcp_metadata(tmp_path):
    from test_hostile_files import _add_dcp_shards

    ck, marker = _checkpoint(tmp_path), tmp_path / "pwned"
    _add_dcp_shards(ck)
    _load(ck)  # a genuine shard set loads through the safe DCP reader
    replace_file(ck, "shards/.metadata", evil_pickle(marker))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata"):
        _load(ck)
    assert not marker.exists()


@pytest.mark.xla
@pytest.mark.skipif(not _REAL_XLA, reason="needs torch_xla with PJRT_DEVICE=CPU: run `make test-xla`")
@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state_0.pt"])
def test_F_REL_3_real_xla_resume_refuses_hostile_files(name, tmp_path):
    def fit(steps: int) -> Fit:
        return Fit(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=steps, save_steps=2,
                   report_to="none", disable_tqdm=True, accelerator="xla")

    marker = tmp_path / "pwned"
    torch.manual_seed(0)
    fit(2).fit(job.Net(), job.data())
    ck = tmp_path / "out" / "checkpoint-2"
    replace_file(ck, name, evil_torch_file(marker))
    torch.manual_seed(0)
    with pytest.raises(UnsafeCheckpointError, match=name.replace(".", r"\.")):
        fit(4).fit(job.Net(), job.data(), resume_from_checkpoint=str(ck))
    assert not marker.exists()
