"""Shared test settings: one thread per process (2-core machines), offline Hugging Face; the S3 fixtures; the
pytest-xdist groups (`make test` runs ``pytest -n 2 --dist loadgroup``)."""

import json
import os
import shutil
import socket
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

MULTIPROCESS_GROUP = "multiprocess"
# Files of a few long tests, with their rough seconds on a quiet 2-core machine (``--durations``, some scaled down
# from a loaded machine; only their order matters): the scheduler starts them first, longest first. xdist orders the groups by their number of tests,
# which put the one-test files among these last, where one worker ran them for a minute while the other had nothing
# left to do.
LONG_FILES = {
    "tests/gpu/test_gpu_kit.py": 43,  # 59 before its rows shared one process (CPU-s 94 -> 69)
    "tests/loggers/test_logger_resume.py": 26,  # 35 before the MLflow file store (CPU-s 39 -> 29)
    "tests/examples/test_own_loop.py": 20,
    "tests/packaging/test_packaging.py": 14,
    "tests/engine/test_engine_benchmark.py": 6,
    "tests/strategies/test_resume_layout.py": 6,
}
_GROUPS_DIR = "taskfit_xdist_groups"  # workerinput key: where each worker writes {nodeid: group}


# ---- pytest-xdist groups for ``-n 2 --dist loadgroup`` ------------------------------------------------------------
# xdist 3.8 passes groups to its scheduler by rewriting ``item._nodeid``, which pytest 9 no longer reads; so each
# worker writes its groups to a file and the scheduler below (a LoadScopeScheduling) reads them by node id.
def _group(item, multi: set) -> str:
    """The group of one test: its ``xdist_group`` mark's name, else its file (rootdir-relative), prefixed with
    ``MULTIPROCESS_GROUP:`` for a file in ``multi``."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    name = item.path.relative_to(item.config.rootpath).as_posix()
    return f"{MULTIPROCESS_GROUP}:{name}" if item.path in multi else name


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: node ids are looked up, extra ones cost nothing
def pytest_collection_modifyitems(config, items):
    """On an xdist worker, write ``{nodeid: group}``: each file is its own group, so its module-scoped fixtures are
    built once and its tests run in file order on one worker, as in a serial run; a file whose default run starts
    several processes (a ``distributed`` test not marked ``slow``) is named ``MULTIPROCESS_GROUP:<file>``, and the
    scheduler runs one such file at a time while single-process files remain (2 workers on 2 cores)."""
    folder = getattr(config, "workerinput", {}).get(_GROUPS_DIR)
    if folder is None:
        return
    multi = {item.path for item in items
             if item.get_closest_marker("distributed") and not item.get_closest_marker("slow")}
    groups = {item.nodeid: _group(item, multi) for item in items}
    path = os.path.join(folder, config.workerinput["workerid"] + ".json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(groups, f)
    os.replace(path + ".tmp", path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist controller: a fresh folder for the workers' group files (removed with the session)."""
    config = node.config
    if not hasattr(config, "_taskfit_groups_dir"):
        config._taskfit_groups_dir = tempfile.mkdtemp(prefix="taskfit-xdist-groups-")
        config.add_cleanup(lambda: shutil.rmtree(config._taskfit_groups_dir, ignore_errors=True))
    node.workerinput[_GROUPS_DIR] = config._taskfit_groups_dir


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: xdist's LoadScopeScheduling (largest group first, then whichever worker is free) over
    the groups the workers wrote, except that the ``LONG_FILES`` start first and one worker runs the multi-process
    files one after another while the other runs the single-process ones, until one kind is used up; other
    ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for name in sorted(os.listdir(config._taskfit_groups_dir)):
                    if name.endswith(".json"):
                        with open(os.path.join(config._taskfit_groups_dir, name), encoding="utf-8") as f:
                            self.groups.update(json.load(f))
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            multi = MULTIPROCESS_GROUP + ":"
            if not getattr(self, "long_first", False):  # once: the long files to the front, longest first
                self.long_first = True
                seconds = {scope: LONG_FILES.get(scope.removeprefix(multi), 0) for scope in self.workqueue}
                for scope in sorted((s for s in seconds if seconds[s]), key=seconds.get):
                    self.workqueue.move_to_end(scope, last=False)
            busy = any(scope.startswith(multi) and not all(unit.values())
                       for other, work in self.assigned_work.items() if other is not node
                       for scope, unit in work.items())
            # the other worker runs a multi-process file: a single-process one; else the next multi-process one
            # (the longest work, so it starts first), each while any is left
            first = next((scope for scope in self.workqueue if scope.startswith(multi) != busy), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


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
