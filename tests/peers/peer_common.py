"""What the peer-suite runners (``run_hf_suite.py``, ``run_lightning_suite.py``) share once each has prepared its
two copies of a peer's test folder: starting pytest on both, reading the junit files, the exceptions list, the
per-test verdict and the report. A runner describes its peer with a :class:`Peer` and calls :func:`run_and_report`.

The runners import this module by name: run as scripts, their folder is ``sys.path[0]``; under pytest, the test
files of this folder put it on the path (no ``__init__.py``: pytest's default ``prepend`` import mode).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: the two kinds of listed exception; the peer's name completes kind 1 ("HF internal", "Lightning internal")
KIND_2 = "documented difference"


@dataclass(frozen=True)
class Peer:
    """One peer suite as the shared code needs it.

    Attributes:
        side (str): the peer copy's folder and junit suffix (``"hf"``, ``"lightning"``; taskfit's is ``"taskfit"``).
        label (str): the peer's name in the report (``"HF"``, ``"Lightning"``).
        tests_root (str): the test folder inside a copy, as pytest's junit names files (``"tests/trainer"``,
            ``"tests_pytorch"``); test ids are relative to it.
        env (dict[str, str]): environment variables for both pytest runs (CPU only, offline...).
    """

    side: str
    label: str
    tests_root: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kinds(self) -> dict[str, str]:
        """``{"1": "<label> internal", "2": "documented difference"}``: the kinds an exceptions line may give."""
        return {"1": f"{self.label} internal", "2": KIND_2}


@dataclass
class Outcome:
    """One test's result on one side: ``status`` is ``passed``, ``failed`` or ``skipped``; ``message`` the first
    line of the failure or skip reason (at most 200 characters)."""
    status: str
    message: str = ""


def pytest_cmd(peer: Peer, files: list[str], junit: Path, timeout: int) -> list[str]:
    """The pytest command line of one copy: ``files`` (relative to ``peer.tests_root``), a junit file in the
    xunit1 family (it records each test's file), ``timeout`` seconds per test when pytest-timeout is installed."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--junitxml", str(junit),
           "-o", "junit_family=xunit1"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(timeout)]
    return cmd + [f"{peer.tests_root}/{f}" for f in files]


def run_side(peer: Peer, root: Path, files: list[str], junit: Path, timeout: int) -> subprocess.Popen:
    """Start pytest on ``files`` of the copy at ``root`` with ``peer.env`` (one thread, no bytecode files, no
    inherited ``PYTHONPATH``); its output goes to ``junit`` with the suffix ``.log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", **peer.env}
    env.pop("PYTHONPATH", None)
    log = open(junit.with_suffix(".log"), "w", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(pytest_cmd(peer, files, junit, timeout), cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def _outcome(case: ET.Element) -> Outcome:
    for tag in ("failure", "error", "skipped"):
        el = case.find(tag)
        if el is not None:
            first = (el.get("message") or el.text or "").strip().splitlines()[0:1]
            return Outcome("skipped" if tag == "skipped" else "failed", first[0][:200] if first else "")
    return Outcome("passed")


def read_junit(path: Path, tests_root: str) -> dict[str, Outcome]:
    """Per-test outcomes of a pytest ``--junitxml`` (xunit1) file, keyed ``dir/file.py::Class::test`` relative to
    ``tests_root`` (``dir/file.py::test`` for a function), from each case's ``file`` attribute (exact for files in
    sub-folders and for classes whatever their name). A teardown error reported after a failed call keeps the
    failure's message.

    Args:
        path (Path): the junit file.
        tests_root (str): the test folder the ids are relative to (``"tests/trainer"``).

    Returns:
        dict[str, Outcome]: empty when the file is missing (pytest did not run).
    """
    if not path.is_file():
        return {}
    prefix = tests_root.rstrip("/") + "/"
    out: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file", "").replace(os.sep, "/").removeprefix(prefix)
        parts = case.get("classname", "").split(".")
        cls = parts[-1] if len(parts) >= 2 and parts[-1] != Path(file).stem else ""
        key = "::".join(p for p in (file, cls, case.get("name", "")) if p)
        if key in out and out[key].status == "failed":
            continue
        out[key] = _outcome(case)
    return out


def read_exceptions(path: Path, kinds: dict[str, str]) -> dict[str, tuple[str, str]]:
    """An exceptions file: ``test id | kind | reason`` a line, ``#`` comment lines and blank lines ignored.

    Args:
        path (Path): the file; a missing file lists nothing.
        kinds (dict[str, str]): the valid kinds (:attr:`Peer.kinds`).

    Returns:
        dict[str, tuple[str, str]]: ``{test id: (kind, reason)}``.

    Raises:
        ValueError: a line without three fields, with an empty reason or with another kind (file and line named).
    """
    out: dict[str, tuple[str, str]] = {}
    if not path.is_file():
        return out
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("|", 2)]
        if len(fields) != 3 or fields[1] not in kinds or not fields[2]:
            raise ValueError(f"{path}:{n}: expected 'test id | {' or '.join(kinds)} | reason', got {raw!r}")
        out[fields[0]] = (fields[1], fields[2])
    return out


def _fmt(o: Outcome | None) -> str:
    return "-" if o is None else {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[o.status]


def verdict_line(peer: Peer, key: str, theirs: Outcome | None, ours: Outcome | None,
                 exceptions: dict[str, tuple[str, str]], counts: dict[str, int]) -> str:
    """One test's report line (``  <label> pass  taskfit FAIL  id  -- note``); counts it into ``counts``
    (``peer``: passes under the peer, ``tf``: also under taskfit, ``1``/``2``: listed failures by kind,
    ``unlisted``: a peer-passing test failing under taskfit without being listed)."""
    note = ""
    if theirs is not None and theirs.status == "passed":
        counts["peer"] += 1
        if ours is not None and ours.status == "passed":
            counts["tf"] += 1
        elif key in exceptions:
            kind, why = exceptions[key]
            counts[kind] += 1
            note = f"listed ({kind}: {peer.kinds[kind]}): {why}"
        else:
            counts["unlisted"] += 1
            note = f"UNLISTED: {ours.message if ours else 'did not run under taskfit'}"
    elif key in exceptions:
        note = f"listed, but does not pass under {peer.label} here"
    return f"  {peer.label} {_fmt(theirs):4}  taskfit {_fmt(ours):4}  {key}" + (f"  -- {note}" if note else "")


def _summary(peer: Peer, what: str, c: dict[str, int]) -> str:
    return (f"summary {what}: {peer.label}-passing {c['peer']}, taskfit-passing {c['tf']}, listed kind-1 {c['1']}, "
            f"kind-2 {c['2']}, unlisted failures {c['unlisted']}")


def report(peer: Peer, files: list[str], theirs: dict[str, Outcome], ours: dict[str, Outcome],
           exceptions: dict[str, tuple[str, str]]) -> int:
    """Print one line per test and a summary line per file and in total.

    Args:
        peer (Peer): the peer suite.
        files (list[str]): the test files, relative to ``peer.tests_root``, in report order.
        theirs, ours (dict[str, Outcome]): :func:`read_junit` of the peer's copy and of taskfit's.
        exceptions (dict[str, tuple[str, str]]): :func:`read_exceptions`.

    Returns:
        int: the unlisted failures (0: the verdict passes).
    """
    total = dict.fromkeys(("peer", "tf", "1", "2", "unlisted"), 0)
    for file in files:
        counts = dict.fromkeys(total, 0)
        print(f"== {file}")
        for key in sorted(k for k in set(theirs) | set(ours) if k.split("::", 1)[0] == file):
            print(verdict_line(peer, key, theirs.get(key), ours.get(key), exceptions, counts))
        print(_summary(peer, file, counts))
        for k in total:
            total[k] += counts[k]
    print(_summary(peer, "all", total))
    return total["unlisted"]


def run_and_report(peer: Peer, files: list[str], out: Path | None, exceptions: Path, timeout: int,
                   prepare: Callable[[Path], dict[str, Path]] | None) -> int:
    """Run ``files`` on both copies at once (unless ``prepare`` is None: report only) and report every junit file
    in ``out`` merged (keys carry the file name, so runs of single files can be reported together).

    Args:
        peer (Peer): the peer suite.
        files (list[str]): test files relative to ``peer.tests_root``.
        out (Path | None): where the junit files and logs stay (None: a new temporary folder).
        exceptions (Path): the exceptions file.
        timeout (int): seconds per test.
        prepare (Callable[[Path], dict[str, Path]] | None): given a temporary work folder, makes the two copies
            and returns ``{peer.side: root, "taskfit": root}``.

    Returns:
        int: the exit status: 1 with unlisted failures, else 0.

    Raises:
        ValueError: a malformed exceptions file (before any test runs).
    """
    listed = read_exceptions(exceptions, peer.kinds)
    sides = (peer.side, "taskfit")
    out = out or Path(tempfile.mkdtemp(prefix=f"peer-{peer.side}-out-"))
    out.mkdir(parents=True, exist_ok=True)
    stem = "_".join(Path(f).stem for f in files) if len(files) < 3 else "suite"
    junit = {side: out / f"{stem}.{side}.xml" for side in sides}
    if prepare is not None:
        with tempfile.TemporaryDirectory(prefix=f"peer-{peer.side}-") as work:
            roots = prepare(Path(work))
            procs = [run_side(peer, roots[s], files, junit[s], timeout) for s in sides]
            for proc in procs:
                proc.wait()
    merged = {side: {k: v for x in sorted(out.glob(f"*.{side}.xml")) for k, v in read_junit(x, peer.tests_root).items()}
              for side in sides}
    unlisted = report(peer, files, merged[peer.side], merged["taskfit"], listed)
    print(f"(junit files and logs in {out})")
    return 1 if unlisted else 0
