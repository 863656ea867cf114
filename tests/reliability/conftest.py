"""In-process runs with ``strategy="fsdp", devices=1`` form a one-process group and export the rendezvous
variables into this process: tear both down after every test, so later tests (and the jobs they start, which
inherit the environment) do not find the port taken."""

import os

import pytest

_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "TASKFIT_LAUNCHED")


@pytest.fixture(autouse=True)
def _isolated_process_group():
    saved = {k: os.environ.get(k) for k in _VARS}
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
