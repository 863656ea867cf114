"""Shared test settings: one thread per process (2-core machines), offline Hugging Face; the S3 fixtures."""

import os
import socket

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


# ---- a real S3 API on 127.0.0.1 (moto's server), for the checkpoint and publishing tests ----------------------
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
