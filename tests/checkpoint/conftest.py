"""Fixtures for the checkpoint tests: a real S3 API on 127.0.0.1 (moto's server) and subprocess job runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).with_name("job.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on a free local port; yields ``(endpoint_url, env)`` where ``env`` holds the variables that
    point s3fs (through fsspec's ``FSSPEC_S3_*`` config) and boto at it, for this process and subprocesses."""
    pytest.importorskip("s3fs", reason="s3fs is needed for the S3 tests (pip install taskfit[test])")
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is needed for the S3 tests")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines in the test output
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": endpoint}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec.config

    fsspec.config.set_conf_env(fsspec.config.conf)  # pick up FSSPEC_S3_ENDPOINT_URL in this process too
    yield endpoint, env
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    fsspec.config.conf.get("s3", {}).pop("endpoint_url", None)


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket; yields its ``s3://name`` URL."""
    import s3fs

    name = "taskfit-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_server[0]}, skip_instance_cache=True)
    if not fs.exists(name):
        fs.mkdir(name)
    yield f"s3://{name}"


def run_job(cfg: dict, tmp_path: Path, name: str, env: dict | None = None, expect_kill: bool = False) -> dict | None:
    """Run ``job.py`` with ``cfg`` in a fresh process; returns its result dict, or None when it was killed."""
    cfg = {**cfg, "result": str(tmp_path / f"{name}.pt")}
    cfg_path = tmp_path / f"{name}.json"
    cfg_path.write_text(json.dumps(cfg))
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, str(JOB), str(cfg_path)], env=full_env, capture_output=True, text=True,
                          timeout=300)
    if expect_kill:
        assert proc.returncode == -9, f"expected SIGKILL, got rc={proc.returncode}\n{proc.stderr[-3000:]}"
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(cfg["result"], weights_only=True)


def assert_same_run(ref: dict, got: dict) -> None:
    """Bitwise-equal weights and optimizer state, equal logged metrics and training loss."""
    assert ref["global_step"] == got["global_step"]
    for k, v in ref["weights"].items():
        assert torch.equal(v, got["weights"][k]), k
    for pid, st in ref["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(got["optimizer"]["state"][pid][k])), (pid, k)
    assert ref["log_history"] == got["log_history"]
    assert ref["train_loss"] == got["train_loss"]
