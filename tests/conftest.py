"""Shared test settings: one thread per process (2-core machines), offline Hugging Face; the S3 fixtures; the
pytest-xdist groups (`make test` runs ``pytest -n 2 --dist loadgroup``)."""

import os
import socket

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

MULTIPROCESS_GROUP = "multiprocess"


# ---- pytest-xdist groups for ``--dist loadgroup`` ----------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into node-id suffixes
def pytest_collection_modifyitems(config, items):
    """Give every test an ``xdist_group`` unless it names one: a file whose default run starts several processes
    (a ``distributed`` test not marked ``slow``) goes whole into one shared group, so at most one multi-process job
    runs at a time beside one single-process worker (2 cores); every other file is its own group, so a file's
    module-scoped fixtures are built once and its tests run in file order on one worker, as in a serial run.
    Without xdist the marks are inert."""
    multi = {item.path for item in items
             if item.get_closest_marker("distributed") and not item.get_closest_marker("slow")}
    root = config.rootpath
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            name = MULTIPROCESS_GROUP if item.path in multi else item.path.relative_to(root).as_posix()
            item.add_marker(pytest.mark.xdist_group(name))


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
