"""The Lightning peer-suite runner itself (tests/peers/run_lightning_suite.py): its import rewriting and its two
copies, on small synthetic test files (no Lightning test file, no network). The verdict and the report it shares
with the HF runner are tested in test_peer_common.py."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
from peer_common import read_exceptions

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("run_lightning_suite", HERE / "run_lightning_suite.py")
run_lightning_suite = importlib.util.module_from_spec(_spec)
sys.modules["run_lightning_suite"] = run_lightning_suite
_spec.loader.exec_module(run_lightning_suite)

PROVIDED = run_lightning_suite.Provided(
    top={"LightningModule", "LightningDataModule", "Trainer", "Callback", "seed_everything"},
    spaces={"callbacks": {"Callback", "EarlyStopping", "ModelCheckpoint"}, "loggers": {"CSVLogger"}})

SOURCE = '''\
import os
from lightning.pytorch import LightningModule, Trainer as T, LightningOptimizer
from lightning.pytorch.callbacks import (
    EarlyStopping,
    ModelCheckpoint as MC,
    Timer,
)
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.core.module import LightningModule as LM
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.fabric.utilities.seed import seed_everything
from tests_pytorch.helpers.runif import RunIf


def helper():
    from lightning.pytorch import Trainer
    return Trainer, "from lightning.pytorch import Trainer"
'''

EXPECTED = '''\
import os
from taskfit.lightning import LightningModule, Trainer as T
from lightning.pytorch import LightningOptimizer
from taskfit.lightning import callbacks as _taskfit_callbacks
EarlyStopping = _taskfit_callbacks.EarlyStopping
MC = _taskfit_callbacks.ModelCheckpoint
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from taskfit.lightning import LightningModule as LM
from taskfit.lightning import loggers as _taskfit_loggers
CSVLogger = _taskfit_loggers.CSVLogger
from tests_pytorch._taskfit_demos import BoringModel
from taskfit.lightning import seed_everything
from tests_pytorch.helpers.runif import RunIf


def helper():
    from taskfit.lightning import Trainer
    return Trainer, "from lightning.pytorch import Trainer"
'''


def test_rewrite_moves_only_provided_names():
    text, moved = run_lightning_suite.rewrite_imports(SOURCE, PROVIDED)
    assert text == EXPECTED
    assert moved == ["LightningModule", "Trainer", "EarlyStopping", "ModelCheckpoint", "LightningModule", "CSVLogger",
                     "BoringModel", "seed_everything", "Trainer"]
    ast.parse(text)


def test_rewrite_keeps_demos_when_asked():
    text, moved = run_lightning_suite.rewrite_imports(
        "from lightning.pytorch.demos.boring_classes import BoringModel\n", PROVIDED, demos=False)
    assert text == "from lightning.pytorch.demos.boring_classes import BoringModel\n" and moved == []


@pytest.mark.parametrize("body, swapped", [
    ("class M(pl.LightningModule):\n    pass\nt = pl.Trainer(callbacks=[pl.callbacks.EarlyStopping('x')])\n", True),
    ("t = pl.Trainer()\nx = pl.utilities.rank_zero_only\n", False),  # a name taskfit.lightning does not provide
    ("t = pl.Trainer()\nprint(pl)\n", False),  # the module object itself
    ("t = pl.callbacks.Timer()\n", False),  # a callback taskfit.lightning.callbacks does not hold
])
def test_module_alias_swapped_only_when_every_use_is_provided(body, swapped):
    source = "import lightning.pytorch as pl\n" + body
    text, moved = run_lightning_suite.rewrite_imports(source, PROVIDED)
    assert text.splitlines()[0] == ("import taskfit.lightning as pl" if swapped else "import lightning.pytorch as pl")
    assert text.splitlines()[1:] == source.splitlines()[1:]
    assert moved == (["pl"] if swapped else [])


def test_profiler_imports_swap_from_lightnings_submodules():
    """``lightning.pytorch.profilers`` and its submodules (``.simple``) bind taskfit.lightning.profilers' names;
    names it does not hold stay on Lightning; a Provided without the namespace swaps nothing."""
    provided = run_lightning_suite.Provided(PROVIDED.top, {**PROVIDED.spaces, "profilers": {"SimpleProfiler"}})
    source = ("from lightning.pytorch.profilers.simple import SimpleProfiler\n"
              "from lightning.pytorch.profilers import SimpleProfiler as SP, XLAProfiler\n")
    text, moved = run_lightning_suite.rewrite_imports(source, provided)
    assert text == ("from taskfit.lightning import profilers as _taskfit_profilers\n"
                    "SimpleProfiler = _taskfit_profilers.SimpleProfiler\n"
                    "from taskfit.lightning import profilers as _taskfit_profilers\n"
                    "SP = _taskfit_profilers.SimpleProfiler\n"
                    "from lightning.pytorch.profilers import XLAProfiler\n")
    assert moved == ["SimpleProfiler", "SimpleProfiler"]
    assert run_lightning_suite.rewrite_imports(source, PROVIDED) == (source, [])
    assert {"SimpleProfiler", "PassThroughProfiler"} <= run_lightning_suite.taskfit_lightning_names().spaces["profilers"]


def test_is_overridden_import_moves_with_the_module_class():
    """``is_overridden`` (Lightning's model_helpers) is swapped: Lightning's own rejects a taskfit module
    ("Expected a parent"); the rest of the utilities stay on Lightning."""
    provided = run_lightning_suite.Provided(top=PROVIDED.top | {"is_overridden"}, spaces=PROVIDED.spaces)
    source = ("from lightning.pytorch.utilities.model_helpers import is_overridden\n"
              "from lightning.pytorch.utilities import rank_zero_only, is_overridden as iso\n")
    text, moved = run_lightning_suite.rewrite_imports(source, provided)
    assert text == ("from taskfit.lightning import is_overridden\n"
                    "from taskfit.lightning import is_overridden as iso\n"
                    "from lightning.pytorch.utilities import rank_zero_only\n")
    assert moved == ["is_overridden", "is_overridden"]



def test_misconfiguration_exception_import_moves_from_both_exception_modules():
    """``MisconfigurationException`` is swapped whether a test imports it from ``lightning.pytorch.utilities.
    exceptions`` or ``lightning.fabric.utilities.exceptions``; the modules' other names stay on Lightning."""
    provided = run_lightning_suite.taskfit_lightning_names()
    assert "MisconfigurationException" in provided.top
    source = ("from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException\n"
              "from lightning.fabric.utilities.exceptions import MisconfigurationException as ME\n")
    text, moved = run_lightning_suite.rewrite_imports(source, provided)
    assert text == ("from taskfit.lightning import MisconfigurationException\n"
                    "from lightning.pytorch.utilities.exceptions import SIGTERMException\n"
                    "from taskfit.lightning import MisconfigurationException as ME\n")
    assert moved == ["MisconfigurationException", "MisconfigurationException"]

def test_provided_names_read_from_the_source():
    provided = run_lightning_suite.taskfit_lightning_names()
    assert {"LightningModule", "Trainer", "seed_everything", "is_overridden"} <= provided.top
    assert "callbacks" not in provided.top
    assert {"EarlyStopping", "ModelCheckpoint", "LambdaCallback"} <= provided.spaces["callbacks"]
    assert {"CSVLogger", "TensorBoardLogger"} <= provided.spaces["loggers"]


def test_the_repositorys_exceptions_list_reads():
    listed = read_exceptions(run_lightning_suite.DEFAULT_EXCEPTIONS, run_lightning_suite.PEER.kinds)
    assert isinstance(listed, dict) and all(kind in ("1", "2") for kind, _ in listed.values())
    assert run_lightning_suite.PEER.kinds == {"1": "Lightning internal", "2": "documented difference"}


def test_prepare_copies_rewrites_only_the_taskfit_side(tmp_path):
    src = tmp_path / "src" / "tests_pytorch"
    (src / "core").mkdir(parents=True)
    (src / "conftest.py").write_text("")
    (src / "core" / "test_m.py").write_text("from lightning.pytorch import Trainer\n")
    roots = run_lightning_suite.prepare_copies(tmp_path / "src", tmp_path / "work", PROVIDED, demos=True)
    assert (roots["lightning"] / "tests_pytorch/core/test_m.py").read_text() == "from lightning.pytorch import Trainer\n"
    assert (roots["taskfit"] / "tests_pytorch/core/test_m.py").read_text() == "from taskfit.lightning import Trainer\n"
    demos = (roots["taskfit"] / "tests_pytorch/_taskfit_demos.py").read_text()
    assert "from taskfit.lightning import LightningDataModule, LightningModule" in demos
    assert not (roots["lightning"] / "tests_pytorch/_taskfit_demos.py").exists()


@pytest.mark.parametrize("body, swapped", [
    ("t = Trainer(callbacks=[callbacks.ModelCheckpoint(monitor='x')])\n", True),
    ("t = Trainer(callbacks=[callbacks.Timer()])\n", False),  # a callback taskfit.lightning.callbacks does not hold
    ("print(callbacks)\n", False),  # the module object itself
])
def test_namespace_module_import_swapped_only_when_every_use_is_provided(body, swapped):
    """``from lightning.pytorch import Trainer, callbacks`` moves ``callbacks`` too when every ``callbacks.X`` it
    is used for is a member of ``taskfit.lightning.callbacks``; otherwise it stays on Lightning."""
    source = "from lightning.pytorch import Trainer, callbacks\n" + body
    text, moved = run_lightning_suite.rewrite_imports(source, PROVIDED)
    first = text.splitlines()[:2]
    if swapped:
        assert first == ["from taskfit.lightning import Trainer, callbacks", body.splitlines()[0]]
        assert moved == ["Trainer", "callbacks"]
    else:
        assert first == ["from taskfit.lightning import Trainer", "from lightning.pytorch import callbacks"]
        assert moved == ["Trainer"]
