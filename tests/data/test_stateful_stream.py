"""F-FT-6: a stateful iterable (its own ``state_dict``/``load_state_dict``) resumes mid-epoch from its saved
per-rank state, without reading the consumed samples again; a plain iterable still resumes by reading and dropping
them; with DataLoader workers the state is not visible to the main process, so the skip is kept, with a warning."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from stream_common import N, Recorder, stream_samples
from taskfit import Fit
from torch.utils.data import IterableDataset

BATCH, STOP, STEPS = 2, 3, 10  # 8 batches per pass of N = 16: the resumed run crosses into a second pass


class Stream(IterableDataset):
    """``N`` samples per pass in an order drawn from the epoch; ``fetched`` counts the samples it produced (in this
    process)."""

    def __init__(self) -> None:
        self.x, self.y = stream_samples()
        self.epoch = self.fetched = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        return torch.randperm(N, generator=torch.Generator().manual_seed(self.epoch)).tolist()

    def __iter__(self):
        for i in self._order():
            self.fetched += 1
            yield {"idx": torch.tensor(i), "x": self.x[i], "y": self.y[i]}


class StatefulStream(Stream):
    """A :class:`Stream` that knows its position: ``state_dict()`` after k samples resumes at sample k."""

    def __init__(self) -> None:
        super().__init__()
        self.pos, self._start = 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._start = state["epoch"], state["pos"]

    def __iter__(self):
        start, self._start = self._start, 0  # a loaded position applies to the next pass only
        self.pos = start
        for i in self._order()[start:]:
            self.fetched += 1
            self.pos += 1
            yield {"idx": torch.tensor(i), "x": self.x[i], "y": self.y[i]}


def _fit(out, max_steps: int, **kw) -> Fit:
    return Fit(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=BATCH, save_steps=STOP,
               save_strategy="steps", disable_tqdm=True, report_to="none", lr_scheduler_type="constant", **kw)


def _json(folder: str, name: str):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


def _interrupted(tmp_path, make_stream, **kw):
    """(uninterrupted module, resumed module, resumed stream, checkpoint folder): a run of ``STEPS`` steps, and
    one stopped at step ``STOP`` (its checkpoint) then resumed to ``STEPS`` on a fresh stream."""
    full = Recorder()
    _fit(tmp_path / "full", STEPS, save_total_limit=1, **kw).fit(full, make_stream())
    _fit(tmp_path / "cut", STOP, **kw).fit(Recorder(), make_stream())
    ckpt = str(tmp_path / "cut" / f"checkpoint-{STOP}")
    resumed, stream = Recorder(), make_stream()
    _fit(tmp_path / "cut", STEPS, **kw).fit(resumed, stream, resume_from_checkpoint=ckpt)
    return full, resumed, stream, ckpt


def test_stateful_iterable_resumes_from_its_state_F_FT_6(tmp_path):
    """F-FT-6: stopped at step 3 and resumed, a stateful stream continues from its saved position: the batches
    after the resume and the final weights equal the uninterrupted run's, and the stream produced only the
    samples still to train on ((10 - 3) steps x 2, none of the 6 consumed ones); the position is this rank's JSON
    file in the manifest."""
    full, resumed, stream, ckpt = _interrupted(tmp_path, StatefulStream)
    assert resumed.seen == full.seen[STOP:]
    assert torch.equal(resumed.layer.weight, full.layer.weight)
    assert stream.fetched == (STEPS - STOP) * BATCH
    manifest = _json(ckpt, "manifest.json")
    assert "data_state_0.json" in manifest["files"]
    assert _json(ckpt, "data_state_0.json") == {"epoch": 0, "pos": STOP * BATCH}


def test_plain_iterable_still_resumes_by_skipping_F_FT_6(tmp_path):
    """F-FT-6: an iterable without ``state_dict`` resumes as before: the same batches, after reading and
    dropping the 6 consumed samples again; no data state is written."""
    full, resumed, stream, ckpt = _interrupted(tmp_path, Stream)
    assert resumed.seen == full.seen[STOP:]
    assert stream.fetched == (STEPS - STOP) * BATCH + STOP * BATCH
    assert not os.path.exists(os.path.join(ckpt, "data_state_0.json"))


def test_stateful_iterable_with_workers_falls_back_to_the_skip_F_FT_6(tmp_path, caplog):
    """F-FT-6: with ``dataloader_num_workers=1`` the stream's position lives in the worker process: the run warns
    once, saves no data state and resumes by the skip, still exactly."""
    with caplog.at_level(logging.WARNING, logger="taskfit"):
        full, resumed, _, ckpt = _interrupted(tmp_path, StatefulStream, dataloader_num_workers=1)
    assert resumed.seen == full.seen[STOP:]
    assert not os.path.exists(os.path.join(ckpt, "data_state_0.json"))
    warned = [r for r in caplog.records if "worker process" in r.getMessage()]
    assert len(warned) == 3  # once per run: the uninterrupted, the stopped and the resumed one
    assert "reads and drops the consumed batches" in warned[0].getMessage()


def test_data_state_json_round_trip_F_FT_6():
    """F-FT-6: a state with tensors (a generator state), tuples and integer keys survives JSON exactly."""
    from taskfit.data.stateful import decode_state, encode_state

    state = {"gen": torch.Generator().manual_seed(3).get_state(), "pair": (1, "a"), "workers": {0: [1.5, None]},
             "scalar": torch.tensor(2.5, dtype=torch.float64)}
    back = decode_state(json.loads(json.dumps(encode_state(state))))
    assert torch.equal(back["gen"], state["gen"]) and back["gen"].dtype == torch.uint8
    assert back["pair"] == (1, "a") and back["workers"] == {0: [1.5, None]}
    assert back["scalar"].dtype == torch.float64 and back["scalar"].shape == () and float(back["scalar"]) == 2.5
    with pytest.raises(TypeError, match=r"holds a object at state\['bad'\]"):
        encode_state({"bad": object()})


def test_datasets_streaming_dataset_resumes_from_its_state_F_FT_6(tmp_path):
    """F-FT-6: a ``datasets.IterableDataset`` (its own ``state_dict``) resumes exactly from its saved state; its
    lazy ``map`` runs only on the samples still to train on, in the second pass too."""
    datasets = pytest.importorskip("datasets")
    calls: list[int] = []
    base = Stream()

    def row(r):
        calls.append(r["idx"])
        return r

    def make():
        data = datasets.Dataset.from_dict({"idx": list(range(N)), "x": base.x.tolist(), "y": base.y.tolist()})
        return data.to_iterable_dataset().map(row).with_format("torch")

    full, resumed, _, ckpt = _interrupted(tmp_path, make)
    assert resumed.seen == full.seen[STOP:]
    assert torch.equal(resumed.layer.weight, full.layer.weight)
    assert "data_state_0.json" in _json(ckpt, "manifest.json")["files"]
    # the three runs mapped: 10 steps, 3 steps, then only the 7 steps left (no consumed sample again)
    assert len(calls) == (STEPS + STOP + STEPS - STOP) * BATCH


def _ddp_job(tmp_path, name: str, **cfg) -> list[dict]:
    """Run ``stream_ddp_job.py`` with 2 DDP processes; both ranks' results."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    cfg = {"out": str(tmp_path / "out"), "result": str(tmp_path / name), **cfg}
    os.makedirs(tmp_path, exist_ok=True)
    (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    proc = subprocess.run([sys.executable, os.path.join(here, "stream_ddp_job.py"), str(tmp_path / f"{name}.json")],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [_json(str(tmp_path), f"{name}.rank{r}.json") for r in range(2)]


@pytest.mark.distributed
@pytest.mark.slow
def test_stateful_iterable_resumes_per_rank_under_ddp_F_FT_6(tmp_path):
    """F-FT-6: 2 DDP processes, each reading its own share of a stateful stream: stopped at step 2 and resumed to
    step 6, each rank continues from its own saved state (``data_state_{rank}.json``): the same batches per rank
    and weights as the uninterrupted run, and each stream produced only the (6 - 2) x 2 samples left."""
    full = _ddp_job(tmp_path / "a", "full", steps=6, save=6)
    _ddp_job(tmp_path / "b", "cut", steps=2, save=2)
    ckpt = str(tmp_path / "b" / "out" / "checkpoint-2")
    assert {"data_state_0.json", "data_state_1.json"} <= set(_json(ckpt, "manifest.json")["files"])
    resumed = _ddp_job(tmp_path / "b", "resumed", steps=6, save=6, resume=ckpt)
    for rank in range(2):
        assert resumed[rank]["seen"] == full[rank]["seen"][2:]
        assert resumed[rank]["fetched"] == (6 - 2) * 2
        assert resumed[rank]["weight"] == full[rank]["weight"]


@pytest.mark.distributed
@pytest.mark.slow
def test_torchdata_stateful_dataloader_resumes_per_rank_under_ddp_F_FT_6(tmp_path):
    """F-FT-6: 2 DDP processes fed by torchdata's ``StatefulDataLoader`` over rows in a fixed shuffled order
    (taskfit splits it per rank and keeps it a ``StatefulDataLoader``): stopped at step 2 and resumed to step 6, each rank resumes from the
    loader's own state (``data_state_{rank}.json``): the same batches and weights as the uninterrupted run, and each
    rank loaded only the (6 - 2) x 2 rows left."""
    pytest.importorskip("torchdata.stateful_dataloader")
    full = _ddp_job(tmp_path / "a", "full", steps=6, save=6, loader="torchdata")
    _ddp_job(tmp_path / "b", "cut", steps=2, save=2, loader="torchdata")
    ckpt = str(tmp_path / "b" / "out" / "checkpoint-2")
    assert _json(ckpt, "data_state_1.json")["_num_yielded"] == 2
    resumed = _ddp_job(tmp_path / "b", "resumed", steps=6, save=6, resume=ckpt, loader="torchdata")
    assert sorted(i for r in range(2) for b in full[r]["seen"][:4] for i in b) == list(range(N))  # split, 1 pass
    for rank in range(2):
        assert resumed[rank]["seen"] == full[rank]["seen"][2:]
        assert resumed[rank]["fetched"] == (6 - 2) * 2
        assert resumed[rank]["weight"] == full[rank]["weight"]


class Rows(torch.utils.data.Dataset):
    """Map-style rows of a :class:`Stream`; ``fetched`` counts the rows loaded."""

    def __init__(self) -> None:
        self.stream, self.fetched = Stream(), 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        self.fetched += 1
        return {"idx": torch.tensor(i), "x": self.stream.x[i], "y": self.stream.y[i]}


class PositionLoader(torch.utils.data.DataLoader):
    """A loader that is stateful itself (as torchdata's ``StatefulDataLoader``): its state is the number of
    batches it yielded in the current pass, and a loaded state starts the next pass there without loading the
    rows before it."""

    def __init__(self, rows: Rows) -> None:
        super().__init__(rows, batch_size=BATCH)
        self.pos = self._start = 0

    def state_dict(self) -> dict:
        return {"batches": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self._start = state["batches"]

    def __iter__(self):
        start, self._start = self._start, 0
        self.pos = start
        for b, indices in enumerate(self.batch_sampler):
            if b >= start:
                self.pos += 1
                yield self.collate_fn([self.dataset[i] for i in indices])


def test_stateful_loader_resumes_from_its_state_F_FT_6(tmp_path):
    """F-FT-6: a loader with its own ``state_dict``/``load_state_dict`` (as torchdata's ``StatefulDataLoader``)
    is the object saved and restored: the same batches after the resume, and only the rows still to train on are
    loaded."""
    rows: list[Rows] = []

    def make():
        rows.append(Rows())
        return PositionLoader(rows[-1])

    full, resumed, _, ckpt = _interrupted(tmp_path, make)
    assert resumed.seen == full.seen[STOP:]
    assert torch.equal(resumed.layer.weight, full.layer.weight)
    assert rows[-1].fetched == (STEPS - STOP) * BATCH
    assert _json(ckpt, "data_state_0.json") == {"batches": STOP}


def test_torchdata_stateful_dataloader_resumes_from_its_state_F_FT_6(tmp_path):
    """F-FT-6: a real torchdata ``StatefulDataLoader`` (a ``RandomSampler`` with its own generator) stopped at
    step 3 resumes from its own ``state_dict``: the same batches after the resume (into the second, reshuffled pass)
    and the same weights as the uninterrupted run, and only the (10 - 3) x 2 rows still to train on are loaded (the
    consumed ones are skipped in the sampler, not read). The generator goes to the sampler: with
    ``shuffle=True, generator=g`` on the loader, torchdata 0.11 itself (no taskfit involved) reshuffles the pass
    after a resumed one differently from an uninterrupted loader."""
    stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
    rows: list[Rows] = []

    def make():
        rows.append(Rows())
        sampler = torch.utils.data.RandomSampler(rows[-1], generator=torch.Generator().manual_seed(7))
        return stateful_dataloader.StatefulDataLoader(rows[-1], batch_size=BATCH, sampler=sampler)

    full, resumed, _, ckpt = _interrupted(tmp_path, make)
    assert resumed.seen == full.seen[STOP:]
    assert sorted(i for b in full.seen[:8] for i in b) == list(range(N))  # shuffled, each row once per pass
    assert full.seen[:2] != [[0, 1], [2, 3]] and full.seen[8:] != full.seen[:2]
    assert torch.equal(resumed.layer.weight, full.layer.weight)
    assert rows[-1].fetched == (STEPS - STOP) * BATCH
    assert _json(ckpt, "data_state_0.json")["_num_yielded"] == STOP
