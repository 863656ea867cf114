"""What both peer-suite runners share (tests/peers/peer_common.py): junit keys for either peer's folder layout, the
exceptions list, the verdict and the report, and the order of checks of a run (a bad exceptions file stops it
before any copy is made). Synthetic junit files only: no peer test file, no pytest run."""

from pathlib import Path

import pytest
from peer_common import Peer, read_exceptions, read_junit, report, run_and_report

HF = Peer(side="hf", label="HF", tests_root="tests/trainer")
LIGHTNING = Peer(side="lightning", label="Lightning", tests_root="tests_pytorch")


def _junit(path: Path, cases: str) -> Path:
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def test_junit_keys_for_the_hf_layout(tmp_path):
    """HF's files sit directly in tests/trainer: ids are ``file.py::Class::test`` and ``file.py::test`` (the
    names hf_exceptions.txt uses), whatever the class is called."""
    f = "tests/trainer/test_trainer.py"
    path = _junit(tmp_path / "x.hf.xml",
                  f'<testcase classname="tests.trainer.test_trainer.TrainerIntegrationTest" name="test_a" file="{f}"/>'
                  f'<testcase classname="tests.trainer.test_trainer.Helper" name="test_b" file="{f}"/>'
                  f'<testcase classname="tests.trainer.test_trainer" name="test_c" file="{f}">'
                  '<skipped message="needs a GPU&#10;second line"/></testcase>')
    got = read_junit(path, HF.tests_root)
    assert {k: (v.status, v.message) for k, v in got.items()} == {
        "test_trainer.py::TrainerIntegrationTest::test_a": ("passed", ""),
        "test_trainer.py::Helper::test_b": ("passed", ""),
        "test_trainer.py::test_c": ("skipped", "needs a GPU")}
    assert read_junit(tmp_path / "missing.xml", HF.tests_root) == {}


def test_junit_keys_for_the_lightning_layout_and_teardown_errors(tmp_path):
    """Lightning's files sit in sub-folders of tests_pytorch: ids keep the sub-folder; a teardown error recorded
    after a failed call keeps the call's failure."""
    f = "tests_pytorch/core/test_x.py"
    path = _junit(tmp_path / "x.lightning.xml",
                  f'<testcase classname="tests_pytorch.core.test_x.TestK" name="test_c" file="{f}"/>'
                  f'<testcase classname="tests_pytorch.core.test_x" name="test_d" file="{f}">'
                  '<failure message="AssertionError: 3 != 4"/></testcase>'
                  f'<testcase classname="tests_pytorch.core.test_x" name="test_d" file="{f}">'
                  '<error message="teardown failed"/></testcase>')
    got = read_junit(path, LIGHTNING.tests_root)
    assert set(got) == {"core/test_x.py::TestK::test_c", "core/test_x.py::test_d"}
    assert (got["core/test_x.py::test_d"].status, got["core/test_x.py::test_d"].message) == (
        "failed", "AssertionError: 3 != 4")


def test_exceptions_accept_kinds_1_and_2_only(tmp_path):
    good = tmp_path / "ok.txt"
    good.write_text("# comment\n\nf.py::C::t | 1 | reads Trainer.accelerator\nf.py::t2 | 2 | docs row X\n")
    assert read_exceptions(good, HF.kinds) == {"f.py::C::t": ("1", "reads Trainer.accelerator"),
                                               "f.py::t2": ("2", "docs row X")}
    assert read_exceptions(tmp_path / "missing.txt", HF.kinds) == {}
    for line in ("f.py::t | 3 | not allowed\n", "f.py::t | 1 |\n", "f.py::t | 1\n"):
        bad = tmp_path / "bad.txt"
        bad.write_text(line)
        with pytest.raises(ValueError, match=r"bad.txt:1: expected 'test id \| 1 or 2 \| reason'"):
            read_exceptions(bad, HF.kinds)


def test_verdict_counts_listed_and_unlisted(tmp_path, capsys):
    """Per test: a peer-passing test failing under taskfit is listed (by kind) or unlisted; the return value is
    the unlisted count; the report's labels follow the peer."""
    f = "tests_pytorch/core/test_x.py"
    theirs = read_junit(_junit(
        tmp_path / "a.lightning.xml",
        f'<testcase classname="tests_pytorch.core.test_x" name="test_a" file="{f}"/>'
        f'<testcase classname="tests_pytorch.core.test_x" name="test_b" file="{f}"/>'
        f'<testcase classname="tests_pytorch.core.test_x.TestK" name="test_c" file="{f}"/>'
        f'<testcase classname="tests_pytorch.core.test_x" name="test_d" file="{f}"><skipped message="gpu"/>'
        '</testcase>'), LIGHTNING.tests_root)
    ours = read_junit(_junit(
        tmp_path / "a.taskfit.xml",
        f'<testcase classname="tests_pytorch.core.test_x" name="test_a" file="{f}"/>'
        f'<testcase classname="tests_pytorch.core.test_x" name="test_b" file="{f}">'
        '<failure message="AttributeError: fit_loop"/></testcase>'
        f'<testcase classname="tests_pytorch.core.test_x.TestK" name="test_c" file="{f}">'
        '<failure message="AssertionError: 3 != 4"/></testcase>'), LIGHTNING.tests_root)
    listed = {"core/test_x.py::test_b": ("1", "reads trainer.fit_loop"), "core/test_x.py::test_d": ("2", "x")}
    assert report(LIGHTNING, ["core/test_x.py"], theirs, ours, listed) == 1
    out = capsys.readouterr().out
    assert "  Lightning pass  taskfit FAIL  core/test_x.py::TestK::test_c  -- UNLISTED: AssertionError: 3 != 4" in out
    assert "core/test_x.py::test_b  -- listed (1: Lightning internal): reads trainer.fit_loop" in out
    assert "  Lightning skip  taskfit -     core/test_x.py::test_d  -- listed, but does not pass under Lightning" in out
    assert ("summary core/test_x.py: Lightning-passing 3, taskfit-passing 1, listed kind-1 1, kind-2 0, "
            "unlisted failures 1") in out
    assert "summary all: Lightning-passing 3," in out


def test_run_refuses_a_bad_exceptions_file_before_any_work(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("f.py::t | 7 | no such kind\n")
    made = []
    with pytest.raises(ValueError, match="bad.txt:1"):
        run_and_report(HF, ["test_trainer.py"], tmp_path / "out", bad, 60, made.append)
    assert made == [] and not (tmp_path / "out").exists()
