"""F-HF-1: the last reporting and data gaps found by transformers' own Trainer tests (tests/peers/hf_gaps.md, issue
26's last round): ``report_to`` auto-enabling Kubeflow as HF, with transformers' own ``KubeflowCallback`` posting the
same progress under ``taskfit.hf``; ``num_input_tokens_seen`` in HF's rows; ``dataloader_drop_last`` for the
evaluation loaders; the fractional ``state.epoch`` of data without a length. transformers is the oracle: each
scenario runs under both."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, both, hf_names, stable

TRAIN = RegressionDataset(length=16)
KUBEFLOW_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "DISABLE_KUBEFLOW_INTEGRATION")


@pytest.mark.parametrize("env", [{"KUBEFLOW_TRAINER_SERVER_URL": "https://test-url"},
                                 {"KUBEFLOW_TRAINER_SERVER_URL": "https://test-url", "DISABLE_KUBEFLOW_INTEGRATION": "true"},
                                 {}])
def test_report_to_auto_enables_kubeflow_as_hf_F_HF_1(env, monkeypatch, tmp_path):
    """``KUBEFLOW_TRAINER_SERVER_URL`` set (and ``DISABLE_KUBEFLOW_INTEGRATION`` not ``TRUE``) adds
    ``"kubeflow"`` to ``report_to`` once, also over ``"none"``, as HF 5's ``TrainingArguments``."""
    for key in KUBEFLOW_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cases = ("none", "tensorboard", ["kubeflow", "tensorboard"], ["tensorboard", "kubeflow"])
    got = {w: [hf_names(w).TrainingArguments(output_dir=str(tmp_path), report_to=c).report_to for c in cases]
           for w in ("hf", "tf")}
    assert got["hf"] == got["tf"]
    added = "KUBEFLOW_TRAINER_SERVER_URL" in env and "DISABLE_KUBEFLOW_INTEGRATION" not in env
    assert got["hf"][0] == (["kubeflow"] if added else [])


def test_kubeflow_is_not_auto_enabled_without_transformers_F_HF_1(monkeypatch, tmp_path):
    """The auto-enabled name runs transformers' own callback: without transformers (optional for taskfit) a run
    inside a Kubeflow TrainJob keeps its loggers instead of failing; naming ``"kubeflow"`` still asks for it."""
    from taskfit import FitArguments
    from taskfit.arguments import validation

    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://test-url")
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    monkeypatch.setattr(validation, "transformers_installed", lambda: False)
    assert FitArguments(output_dir=str(tmp_path), report_to="none").report_to == []
    assert FitArguments(output_dir=str(tmp_path), report_to="kubeflow").report_to == ["kubeflow"]


class _Recorder(BaseHTTPRequestHandler):
    posts: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts.append({"auth": self.headers["Authorization"], **body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # keep the test output quiet
        pass


def _comparable(post: dict[str, Any]) -> dict[str, Any]:
    """A posted status without its wall-clock parts (time stamp, ETA, runtime and throughput numbers)."""
    status = dict(post["trainerStatus"])
    status.pop("lastUpdatedTime")
    status.pop("estimatedRemainingSeconds", None)
    metrics = {m["name"]: m["value"] for m in status.pop("metrics", [])
               if not m["name"].endswith(("_runtime", "_per_second", "total_flos"))}
    return {"auth": post["auth"], **status, "metrics": metrics}


def test_kubeflow_callback_posts_the_same_progress_F_HF_1(monkeypatch, tmp_path):
    """With ``report_to`` auto-enabled, transformers' own ``KubeflowCallback`` runs in ``taskfit.hf`` and posts
    the same statuses as under transformers: 0 % with the step total at the start, each step's progress with the
    last logged loss / grad norm / learning rate / epoch, 100 % at the end (throttling off to see every post)."""
    from transformers.integrations import KubeflowCallback

    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", f"http://127.0.0.1:{server.server_port}/status")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    monkeypatch.setattr(KubeflowCallback, "_MIN_UPDATE_INTERVAL", 0.0)

    def run(m, out):
        _Recorder.posts = []
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(a=1.5, b=2.5), train_dataset=TRAIN,
                      args=args_for(m, out, max_steps=3, logging_steps=1, report_to="none"))
        kinds = [type(cb).__name__ for cb in t.callback_handler.callbacks]
        t.train()
        return kinds.count("KubeflowCallback"), [_comparable(p) for p in _Recorder.posts]
    try:
        hf, tf = both(run, tmp_path)
    finally:
        server.shutdown()
    assert hf == tf
    count, posts = hf
    assert count == 1 and len(posts) == 5 and posts[0]["auth"] == "Bearer secret-token"
    assert [p["progressPercentage"] for p in posts] == [0, 33, 66, 99, 100]
    assert posts[3]["metrics"]["current_step"] == "3" and "loss" in posts[3]["metrics"]


class _TokenData(torch.utils.data.Dataset):
    """Token sequences of 3-5 ids with a float label (padded by :func:`_pad`)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = torch.randint(0, 10, (3 + i % 3,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": torch.tensor(float(i % 2))}


def _pad(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    n = max(len(x["input_ids"]) for x in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros(len(items), n, dtype=torch.long)
    for j, x in enumerate(items):
        ids[j, :len(x["input_ids"])], mask[j, :len(x["input_ids"])] = x["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([x["labels"] for x in items])}


class _TokenModel(nn.Module):
    """Sum of one learned number per non-padding token, regressed onto the label."""

    main_input_name = "input_ids"

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: Any = None) -> Any:
        y = (self.emb(input_ids).squeeze(-1) * attention_mask).sum(1)
        return (nn.functional.mse_loss(y, labels), y)


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    """A log row without wall-clock keys, floats to 5 significant digits (evaluation sums in another order)."""
    return {k: float(f"{v:.5g}") if isinstance(v, float) else v for k, v in stable(row).items()}


@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_num_input_tokens_seen_in_every_row_as_hf_F_HF_1(mode, tmp_path):
    """``include_num_input_tokens_seen`` counts HF's tokens (every ``input_ids`` element, or the
    ``attention_mask`` sum for ``"non_padding"``) and puts the running count into the same rows as HF: each loss
    row, each evaluation row and the end-of-run row (and the dict ``evaluate()`` returns), with no extra row."""
    def run(m, out):
        m.set_seed(0)
        t = m.Trainer(model=_TokenModel(), train_dataset=_TokenData(), eval_dataset=_TokenData(), data_collator=_pad,
                      args=args_for(m, out, per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=4,
                                    logging_steps=2, eval_strategy="steps", eval_steps=2,
                                    include_num_input_tokens_seen=mode))
        t.train()
        ev = t.evaluate()
        return [_rounded(r) for r in t.state.log_history], ev["num_input_tokens_seen"]
    hf, tf = both(run, tmp_path)
    assert hf == tf
    rows, total = hf
    seen = [33, 33, 64, 64, 64, 64] if mode == "non_padding" else [40, 40, 80, 80, 80, 80]  # loss/eval x2, end, eval
    assert [r.get("num_input_tokens_seen") for r in rows] == seen and total == seen[-1]


def test_dataloader_drop_last_applies_to_eval_and_test_loaders_F_HF_1(tmp_path):
    """``dataloader_drop_last=True`` drops the last short batch of the evaluation and test loaders too (HF's
    ``get_eval_dataloader`` / ``get_test_dataloader``): 12 samples in batches of 5 evaluate and predict 10."""
    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(a=1.5, b=2.5), train_dataset=RegressionDataset(length=12),
                      eval_dataset=RegressionDataset(length=12, seed=1),
                      args=args_for(m, out, per_device_eval_batch_size=5, dataloader_drop_last=True, max_steps=2))
        t.train()
        pred = t.predict(RegressionDataset(length=12, seed=2))
        return (len(t.get_eval_dataloader()), _rounded(t.evaluate()), pred.predictions.shape,
                round(pred.metrics["test_loss"], 6))
    hf, tf = both(run, tmp_path)
    assert hf == tf and hf[0] == 2 and hf[2] == (10,)


class _Stream(torch.utils.data.IterableDataset):
    """A dataset without a length: the samples of a ``RegressionDataset`` in order."""

    def __init__(self, n: int) -> None:
        self.data = RegressionDataset(length=n)

    def __iter__(self) -> Any:
        return (self.data[i] for i in range(len(self.data)))


@pytest.mark.parametrize("n, accumulation", [(40, 2), (12, 1)])
def test_epoch_fraction_without_length_as_hf_F_HF_1(n, accumulation, tmp_path):
    """With data that has no length, ``state.epoch`` grows by micro-batches over ``max_steps x
    gradient_accumulation_steps`` (HF's ``steps_in_epoch``), restarting from the epoch count when the data runs
    out (12 samples: 0.6 after the first pass, then 1.2)."""
    def run(m, out):
        m.set_seed(42)
        t = m.Trainer(model=RegressionModel(a=1.5, b=2.5), train_dataset=_Stream(n),
                      args=args_for(m, out, per_device_train_batch_size=4, max_steps=5, logging_steps=1,
                                    gradient_accumulation_steps=accumulation))
        r = t.train()
        return [(row["step"], round(row["epoch"], 6)) for row in t.state.log_history], round(r.metrics["epoch"], 6)
    hf, tf = both(run, tmp_path)
    assert hf == tf
    assert [e for _, e in hf[0][:5]] == ([0.2, 0.4, 0.6, 0.8, 1.0] if n == 40 else [0.2, 0.4, 0.6, 1.2, 1.4])


def test_drop_last_of_training_data_without_length_is_a_documented_difference_F_HF_1(tmp_path):
    """docs/hf.md "Intended differences", ``dataloader_drop_last=True`` with training data that has no length: HF
    keeps the short last batch of each pass (10 samples in 4s: 4, 4, 2), taskfit drops it as for map-style data."""
    def run(m, out):
        sizes: list[int] = []

        def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            sizes.append(len(items))
            return {k: torch.as_tensor(np.stack([x[k] for x in items])) for k in items[0]}
        m.set_seed(42)
        m.Trainer(model=RegressionModel(a=1.5, b=2.5), train_dataset=_Stream(10), data_collator=collate,
                  args=args_for(m, out, per_device_train_batch_size=4, max_steps=5, dataloader_drop_last=True)).train()
        return sizes
    hf, tf = both(run, tmp_path)
    assert hf[:5] == [4, 4, 2, 4, 4] and tf[:5] == [4, 4, 4, 4, 4]  # HF collates one batch ahead
