"""The HF peer-suite runner itself (tests/peers/run_hf_suite.py): its import rewriting and, end to end through the
code it shares with the Lightning runner (tests/peers/peer_common.py), its verdict, on small synthetic test files
(no transformers test file, no network)."""

import importlib.util
import sys
from pathlib import Path

from peer_common import read_exceptions

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("run_hf_suite", HERE / "run_hf_suite.py")
run_hf_suite = importlib.util.module_from_spec(_spec)
sys.modules["run_hf_suite"] = run_hf_suite
_spec.loader.exec_module(run_hf_suite)

NAMES = {"Trainer", "TrainingArguments", "TrainerCallback", "TrainerState", "TrainerControl", "EarlyStoppingCallback",
         "set_seed"}

SOURCE = '''\
import os
from transformers import AutoModel, Trainer, TrainingArguments as TA
from transformers import (
    AutoTokenizer,
    EarlyStoppingCallback,
    is_torch_available,
)
from transformers.trainer_callback import CallbackHandler, TrainerControl
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, set_seed
from transformers.testing_utils import require_torch
from transformers.modeling_utils import Trainer as NotTheTrainer
from .trainer_test_utils import Trainer as Local

if is_torch_available():
    from transformers import TrainerState


def helper():
    from transformers import Trainer
    return Trainer, "from transformers import Trainer"
'''

EXPECTED = '''\
import os
from taskfit.hf import Trainer, TrainingArguments as TA
from transformers import AutoModel
from taskfit.hf import EarlyStoppingCallback
from transformers import AutoTokenizer, is_torch_available
from taskfit.hf import TrainerControl
from transformers.trainer_callback import CallbackHandler
from taskfit.hf import set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.testing_utils import require_torch
from transformers.modeling_utils import Trainer as NotTheTrainer
from .trainer_test_utils import Trainer as Local

if is_torch_available():
    from taskfit.hf import TrainerState


def helper():
    from taskfit.hf import Trainer
    return Trainer, "from transformers import Trainer"
'''


def test_rewrite_moves_only_taskfit_names_of_trainer_modules():
    """Only the names taskfit.hf provides move, from the Trainer modules only, at the statement's indentation;
    multi-line imports, aliases, nested imports and string literals are handled (strings untouched)."""
    text, moved = run_hf_suite.rewrite_imports(SOURCE, NAMES)
    assert text == EXPECTED
    assert moved == ["Trainer", "TrainingArguments", "EarlyStoppingCallback", "TrainerControl", "set_seed",
                     "TrainerState", "Trainer"]
    compile(text, "rewritten.py", "exec")


def test_rewrite_leaves_a_file_without_those_names_byte_identical():
    src = "from transformers import AutoModel\nimport transformers\nx = transformers.Trainer\n"
    assert run_hf_suite.rewrite_imports(src, NAMES) == (src, [])


def test_taskfit_hf_names_are_read_from_the_module_source():
    names = run_hf_suite.taskfit_hf_names()
    assert {"Trainer", "TrainingArguments", "TrainerCallback", "EarlyStoppingCallback", "TrainerState",
            "TrainerControl"} <= set(names)


def test_the_repositorys_exceptions_list_reads():
    listed = read_exceptions(run_hf_suite.DEFAULT_EXCEPTIONS, run_hf_suite.PEER.kinds)
    assert isinstance(listed, dict) and all(kind in ("1", "2") for kind, _ in listed.values())
    assert run_hf_suite.PEER.kinds == {"1": "HF internal", "2": "documented difference"}


PEER_TEST = '''\
import os


def _never_called():
    from transformers import Trainer, AutoModel  # rewritten in the taskfit copy only


def test_plain():
    assert 1 + 1 == 2


def test_sees_rewrite():
    with open(__file__) as f:
        assert "from taskfit" + ".hf import Trainer" not in f.read()


def test_skipped():
    import pytest
    pytest.skip("needs a GPU")


class TestGroup:
    def test_in_class(self):
        assert True
'''


def _peer_folder(tmp_path: Path) -> Path:
    trainer = tmp_path / "peer" / "tests" / "trainer"
    trainer.mkdir(parents=True)
    (trainer / "test_trainer_tiny.py").write_text(PEER_TEST)
    return tmp_path / "peer"


def test_run_verdict_unlisted_then_listed(tmp_path, capsys):
    """End to end on a synthetic peer file: one test fails only in the rewritten copy; unlisted -> exit 1, listed
    with kind 2 -> exit 0; per-test lines and the summary line give the counts."""
    folder = _peer_folder(tmp_path)
    out = tmp_path / "out"
    none = tmp_path / "none.txt"
    rc = run_hf_suite.main([str(folder), "--files", "test_trainer_tiny.py", "--out", str(out), "--exceptions",
                            str(none)])
    text = capsys.readouterr().out
    assert rc == 1
    # the failure's first line comes from pytest's junit file and its wording varies with pytest's options; the
    # verdict (FAIL, unlisted) is what this runner decides
    assert "HF pass  taskfit FAIL  test_trainer_tiny.py::test_sees_rewrite  -- UNLISTED: " in text, text
    assert "HF pass  taskfit pass  test_trainer_tiny.py::TestGroup::test_in_class" in text
    assert "HF skip  taskfit skip  test_trainer_tiny.py::test_skipped" in text
    assert ("summary test_trainer_tiny.py: HF-passing 3, taskfit-passing 2, listed kind-1 0, kind-2 0, "
            "unlisted failures 1") in text

    listed = tmp_path / "listed.txt"
    listed.write_text("test_trainer_tiny.py::test_sees_rewrite | 2 | docs/hf.md row: synthetic\n")
    rc = run_hf_suite.main([str(folder), "--files", "test_trainer_tiny.py", "--out", str(out), "--exceptions",
                            str(listed), "--report-only"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "listed (2: documented difference): docs/hf.md row: synthetic" in text
    assert "HF-passing 3, taskfit-passing 2, listed kind-1 0, kind-2 1, unlisted failures 0" in text
