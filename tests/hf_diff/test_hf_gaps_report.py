"""F-HF-1: the reporting gaps found by transformers' own Trainer tests (tests/peers/hf_gaps.md, issue 26's last
round): ``report_to`` auto-enabling Kubeflow as HF, with transformers' own ``KubeflowCallback`` posting the same
progress under ``taskfit.hf``. transformers is the oracle: each scenario runs under both."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

pytest.importorskip("accelerate")  # transformers.Trainer needs it

from common import RegressionDataset, RegressionModel, args_for, both, hf_names  # noqa: E402

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


class _Recorder(BaseHTTPRequestHandler):
    posts: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
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
