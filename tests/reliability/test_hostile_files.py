"""No code runs when a checkpoint is loaded with the default ``weights_only=True`` (F-REL-3): on every load path a
file whose unpickling would create a marker file is refused with an error naming it, and the marker never
appears. Paths: the full-file resume (single device / DDP), torch.distributed.checkpoint shards (``.metadata``)
loaded into a single-device run and converted with ``convert_checkpoint``, the DeepSpeed engine's files on
resume and in ``taskfit convert``, and FSDP resume under 2 real processes (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hostile import default_adamw, evil_pickle, evil_torch_file, replace_file
from proc import RJOB, clean_env

from taskfit import Fit
from taskfit.io import UnsafeCheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "checkpoint"))
import job  # noqa: E402

STRATEGIES = Path(__file__).resolve().parent.parent / "strategies"


def _fit(out: Path, **kw) -> Fit:
    return Fit(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, report_to="none",
               disable_tqdm=True, seed=3, **kw)


def _checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    _fit(tmp_path / "out", max_steps=4, save_steps=4).fit(job.Net(), job.data())
    return tmp_path / "out" / "checkpoint-4"


def _resume(ck: Path, tmp_path: Path, **kw):
    torch.manual_seed(0)
    return _fit(tmp_path / "out", max_steps=6, **kw).fit(job.Net(), job.data(), resume_from_checkpoint=str(ck))


@pytest.mark.parametrize("name", ["training_state.pt", "optimizer.pt", "scheduler.pt", "rng_state_0.pt"])
def test_F_REL_3_hostile_torch_file_is_refused_on_resume(name, tmp_path):
    ck, marker = _checkpoint(tmp_path), tmp_path / "pwned"
    replace_file(ck, name, evil_torch_file(marker))
    with pytest.raises(UnsafeCheckpointError, match=name.replace(".", r"\.")):
        _resume(ck, tmp_path)
    assert not marker.exists()


def _add_dcp_shards(ck: Path) -> None:
    """Add a real torch.distributed.checkpoint shard set (as FSDP writes it) of the checkpoint's model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    torch.manual_seed(0)
    model = job.Net()
    opt = default_adamw(model)
    model.body(torch.randn(2, 8)).sum().backward()
    opt.step()
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(ck / "shards"), single_file_per_rank=True),
             no_dist=True)
    for f in sorted((ck / "shards").iterdir()):
        replace_file(ck, f"shards/{f.name}", f.read_bytes(), add=True)


def test_F_REL_3_dcp_shards_load_and_hostile_metadata_is_refused(tmp_path):
    ck, marker = _checkpoint(tmp_path), tmp_path / "pwned"
    _add_dcp_shards(ck)
    _resume(ck, tmp_path)  # a genuine shard set loads through the safe reader
    from taskfit.strategies.checkpoint_shards import convert_checkpoint

    assert set(convert_checkpoint(str(ck))["model"]) == set(job.Net().state_dict())
    replace_file(ck, "shards/.metadata", evil_pickle(marker))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata.*io\.open"):
        _resume(ck, tmp_path)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata"):
        convert_checkpoint(str(ck), str(tmp_path / "converted"))
    assert not marker.exists()


def test_F_REL_3_weights_only_false_is_the_explicit_opt_out(tmp_path):
    ck, marker = _checkpoint(tmp_path), tmp_path / "pwned"
    replace_file(ck, "rng_state_0.pt", evil_torch_file(marker))
    with pytest.raises(Exception):  # the payload is no RNG state: the run fails after unpickling it
        _resume(ck, tmp_path, )
    assert not marker.exists()
    with pytest.raises(Exception):
        torch.manual_seed(0)
        _fit(tmp_path / "out", max_steps=6).fit(job.Net(), job.data(), resume_from_checkpoint=str(ck),
                                                weights_only=False)
    assert marker.exists()  # proves the hostile file really runs code when unpickled without restrictions


def _ds_run(tmp: Path, name: str, cfg: dict) -> subprocess.CompletedProcess:
    cfg = {"bs": 4, "n": 16, "strategy": "deepspeed_stage_2", "devices": 1, "out": str(tmp / "ds"),
           "result": str(tmp / f"{name}.pt"), **cfg}
    (tmp / f"{name}.json").write_text(json.dumps(cfg))
    return subprocess.run([sys.executable, str(STRATEGIES / "deepspeed_job.py"), str(tmp / f"{name}.json")],
                          capture_output=True, text=True, timeout=300, env=clean_env(), cwd=tmp)


@pytest.mark.deepspeed
def test_F_REL_3_deepspeed_engine_files_and_convert_refuse_hostile_pickles(tmp_path):
    pytest.importorskip("deepspeed")
    first = _ds_run(tmp_path, "save", {"steps": 2, "save_steps": 2})
    assert first.returncode == 0, first.stderr[-3000:]
    ck, marker = tmp_path / "ds" / "checkpoint-2", tmp_path / "pwned"
    optim = "shards/deepspeed/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    assert (ck / optim).exists()
    replace_file(ck, optim, evil_torch_file(marker))
    resumed = _ds_run(tmp_path, "resume", {"steps": 3, "save_steps": 2, "resume": True})
    assert resumed.returncode != 0 and "Refusing to load" in resumed.stderr and "optim_states.pt" in resumed.stderr
    conv = subprocess.run([sys.executable, "-m", "taskfit.cli.app", "convert", str(ck), str(tmp_path / "conv")],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert conv.returncode == 2 and "Refusing to load" in conv.stderr
    assert not marker.exists()


def test_F_REL_3_fsdp_strategy_refuses_hostile_dcp_metadata(tmp_path):
    """The FSDP strategy's own load path (one process in this test; 2 processes in the FSDP suite)."""
    out, marker = tmp_path / "out", tmp_path / "pwned"
    torch.manual_seed(0)
    _fit(out, max_steps=2, save_steps=2, strategy="fsdp", devices=1).fit(job.Net(), job.data())
    ck = out / "checkpoint-2"
    replace_file(ck, "shards/.metadata", evil_pickle(marker))
    torch.manual_seed(0)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata.*io\.open"):
        _fit(out, max_steps=4, strategy="fsdp", devices=1).fit(job.Net(), job.data(), resume_from_checkpoint=True)
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout,name,data", [("sharded", "shards/.metadata", evil_pickle),
                                              ("full", "optimizer.pt", evil_torch_file)])
def test_F_REL_3_fsdp_two_processes_refuse_hostile_files_on_resume(layout, name, data, tmp_path):
    """FSDP with 2 real processes: the sharded layout's DCP ``.metadata`` and the full-state-dict layout's
    ``optimizer.pt`` (re-sharded on load) are refused on every rank, naming the file; the marker never appears and
    no process is left."""
    from proc import finish, start, wait_group_gone

    out, marker = tmp_path / "out", tmp_path / "pwned"
    args = {"strategy": "fsdp", "devices": 2, "ddp_timeout": 60, "fsdp_config": {"state_dict_type": layout}}
    first, _ = start(RJOB, {"output_dir": str(out), "resume": None, "save_steps": 2,
                            "args": {**args, "max_steps": 2}}, tmp_path, "save")
    rc, err, _ = finish(first, 300)
    assert rc == 0, err[-3000:]
    ck = out / "checkpoint-2"
    assert (ck / name).exists(), sorted(p.name for p in ck.rglob("*"))
    replace_file(ck, name, data(marker))
    resumed, _ = start(RJOB, {"output_dir": str(out), "resume": True, "save_steps": 2,
                              "args": {**args, "max_steps": 4}}, tmp_path, "resume")
    rc, err, _ = finish(resumed, 300)
    assert wait_group_gone(resumed.pid, 20) == []
    assert rc != 0 and "UnsafeCheckpointError" in err and name.rsplit("/", 1)[-1] in err, err[-3000:]
    assert not marker.exists()
