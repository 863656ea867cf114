"""Shared harness of the benchmark suites: machine labels, fresh worker processes, statistics, result files.

Every suite measures in fresh worker processes (``python -m benchmarks.worker SPEC``) started by
:func:`run_worker`, all with the same environment (:func:`worker_env`): one BLAS/OpenMP thread unless told
otherwise, glibc allocator thresholds fixed (see ``/work/shared/BENCHMARKING.md`` for why) and Hugging Face
offline. Results are written by :func:`write_results` as ``results.json`` (machine-readable), ``results.md``
(the tables) and PNG charts under ``benchmarks/results/<suite>/``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: the repository root (the folder holding ``benchmarks/``)
REPO_ROOT = Path(__file__).resolve().parent.parent
#: default results folder
RESULTS_ROOT = Path(__file__).resolve().parent / "results"
#: allocator thresholds applied to every worker alike (page faults per step drop from hundreds to ~1)
GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


class Skip(Exception):
    """Raised by a worker or a suite when a row cannot run here; the message is the printed reason."""


# ------------------------------------------------------------------------------------------- machine ---
def cpu_model() -> str:
    """CPU model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere), e.g. ``"AMD EPYC"``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` without importing it; None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(threads: int, device: str = "cpu") -> dict[str, Any]:
    """Labels every result carries: versions, CPU model, cores, thread count, GPU name (when ``device`` is
    ``"cuda"``), date (UTC). ``threads`` is the ``torch.set_num_threads`` value the workers used."""
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "device": device,
        "glibc_tunables": GLIBC_TUNABLES,
        "versions": {
            name: package_version(name)
            for name in ("taskfit", "torch", "lightning", "transformers", "deepspeed", "bitsandbytes")
        },
    }
    if device.startswith("cuda"):
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def machine_label(info: dict[str, Any]) -> str:
    """One line naming the machine and software, printed above every table."""
    v = info["versions"]
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ""
    return (
        f"torch {v['torch']}, Python {info['python']}, CPU {info['cpu']} ({info['cpu_count']} cores){gpu}, "
        f"{info['threads']} thread(s) per process, {info['date_utc']} UTC"
    )


def default_out_dir(suite: str, device: str = "cpu", quick: bool = False) -> Path:
    """``benchmarks/results/<suite>/`` (+ ``<device>/`` off CPU, + ``quick/`` for ``--quick`` runs, which are
    not committed)."""
    out = RESULTS_ROOT / suite
    if device != "cpu":
        out = out / device.split(":")[0]
    return out / "quick" if quick else out


# --------------------------------------------------------------------------------------------- stats ---
def summary(values: list[float]) -> dict[str, float] | None:
    """``{"median", "min", "max", "n"}`` of ``values`` (None when empty)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def step_times(stamps: list[float], warmup: int) -> list[float]:
    """Per-step durations (seconds) from the fetch timestamps of consecutive batches, dropping the first
    ``warmup`` steps."""
    diffs = [b - a for a, b in itertools.pairwise(stamps)]
    return diffs[warmup:] if len(diffs) > warmup else diffs


def fmt_bytes(n: float | None) -> str:
    """``123456789`` -> ``"117.7 MiB"``; ``"-"`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_range(s: dict[str, float] | None, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """``"1.03 (1.01-1.05)"``: median and min-max of a :func:`summary`, times ``scale``."""
    if not s:
        return "-"
    f = f"{{:.{digits}f}}"
    med, lo, hi = (f.format(s[k] * scale) for k in ("median", "min", "max"))
    return f"{med}{unit} ({lo}-{hi})" if s["n"] > 1 else f"{med}{unit}"


NOT_COMPARABLE = "not enough repetitions to compare"


def comparable(s: dict[str, float] | None, reference: float = 1.0) -> bool:
    """Whether the repetitions of a ratio's :func:`summary` tell it apart from ``reference``: two or more
    repetitions whose spread (max - min) is smaller than the median's distance from ``reference``."""
    return bool(s) and s["n"] > 1 and (s["max"] - s["min"]) < abs(s["median"] - reference)


def compare_ratio(s: dict[str, float] | None, reference: float = 1.0) -> str:
    """A ratio's cell: ``"1.21x (1.19-1.38, 3 reps)"`` (median, min-max, repetitions), or ``"not enough
    repetitions to compare (...)"`` when the spread across repetitions exceeds the difference from
    ``reference`` (see :func:`comparable`); ``"-"`` without a value."""
    if not s:
        return "-"
    if s["n"] < 2:
        return f"{NOT_COMPARABLE} (1 repetition)"
    spread = f"{s['min']:.2f}-{s['max']:.2f}, {s['n']} reps"
    if not comparable(s, reference):
        return f"{NOT_COMPARABLE} ({spread}, median {s['median']:.2f}x)"
    return f"{s['median']:.2f}x ({spread})"


def plain_number(v: float) -> str:
    """A chart label without exponent notation: ``1170``, ``38.6``, ``1.21``, ``0.0042``."""
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01 or a == 0:
        return f"{v:.2f}"
    return f"{v:.6f}".rstrip("0") if a >= 1e-6 else "0"


# -------------------------------------------------------------------------------------------- memory ---
def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS (Linux ``/proc/self/clear_refs``); returns
    False where that is not possible (then :func:`peak_rss_bytes` is the peak since the process started)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (``VmHWM``; ``ru_maxrss`` where /proc is missing)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024


def rss_bytes() -> int:
    """Current resident set size of this process in bytes (0 where unknown)."""
    kib = _status_kib("VmRSS")
    return (kib or 0) * 1024


def folder_bytes(path: str | os.PathLike) -> int:
    """Total size in bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


# ------------------------------------------------------------------------------------------- workers ---
def worker_env(threads: int = 1) -> dict[str, str]:
    """Environment of every worker: ``threads`` OpenMP/MKL threads, fixed glibc allocator thresholds, the repo
    root on ``PYTHONPATH``, Hugging Face offline, no tokenizer threads, warnings quiet."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        GLIBC_TUNABLES=GLIBC_TUNABLES,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        HF_HUB_DISABLE_TELEMETRY="1",
        TQDM_DISABLE="1",
    )
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    return env


def machine_load() -> dict[str, Any]:
    """The machine's load averages (1, 5, 15 min; None where unknown) and the ``uptime`` line, recorded before and
    after a suite: on a shared machine the load says how much the numbers can be trusted."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = ""
    return {"loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, "uptime": line}


def fmt_load(load: dict[str, Any] | None) -> str:
    """``"5.12, 4.80, 3.95"`` from :func:`machine_load`'s result, ``"unknown"`` without one."""
    la = (load or {}).get("loadavg")
    return ", ".join(f"{v:.2f}" for v in la) if la else "unknown"


def pin_core() -> int | None:
    """The core a single-threaded worker is pinned to: the last one this process may run on (None where
    ``sched_setaffinity`` does not exist)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return max(os.sched_getaffinity(0))


def run_worker(task: str, spec: dict[str, Any], *, threads: int = 1, timeout: float = 900) -> dict[str, Any]:
    """Run ``benchmarks.worker`` task ``task`` with ``spec`` in a fresh process and return its result dict.

    The worker writes its result as JSON to ``spec["out"]`` (a temporary file is chosen here). A worker that
    raises :class:`Skip` or ``NotImplementedError`` returns ``{"skipped": reason}``; any other failure returns
    ``{"error": last lines of stderr}``. ``"wall_s"`` (seconds, including start-up) is added.
    """
    with tempfile.TemporaryDirectory(prefix="taskfit-bench-") as tmp:
        spec = {**spec, "out": os.path.join(tmp, "result.json"), "tmp": tmp, "threads": threads}
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.worker", task, json.dumps(spec)],
                cwd=REPO_ROOT,
                env=worker_env(threads),
                capture_output=True,
                check=False,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:  # one slow row is reported; the suite goes on
            return {"error": f"timed out after {timeout:.0f} s", "wall_s": time.perf_counter() - start}
        wall = time.perf_counter() - start
        try:
            with open(spec["out"]) as f:
                result = json.load(f)
        except (OSError, ValueError):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            result = {"error": f"worker exited with status {proc.returncode}: {tail}"}
    result["wall_s"] = wall
    return result


# ------------------------------------------------------------------------------------------- results ---
def write_results(out_dir: str | os.PathLike, suite: str, data: dict[str, Any], markdown: str) -> list[Path]:
    """Write ``results.json`` and ``results.md`` into ``out_dir`` (created); returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps({"suite": suite, **data}, indent=1, default=str) + "\n")
    paths[1].write_text(markdown.rstrip() + "\n")
    return paths


def select_rows(
    kind: str, rows: list[tuple], only: list[str] | None, always: str | None = None
) -> list[tuple]:
    """The rows (tuples whose first item is the name) named in ``only`` (all when None) plus ``always``.

    Raises:
        ValueError: a name in ``only`` is not a row; the message lists the valid names.
    """
    names = [r[0] for r in rows]
    bad = [n for n in only or [] if n not in names]
    if bad:
        raise ValueError(f"Unknown {kind} row(s) {bad}; valid: {', '.join(names)}.")
    return [r for r in rows if not only or r[0] in only or r[0] == always]


def finish(
    suite: str, data: dict[str, Any], markdown: str, out_dir: str | os.PathLike, chart: Any = None
) -> None:
    """Write the suite's results (:func:`write_results`), its charts (``chart(data, out_dir)``), print the
    Markdown to stdout and say where the files are."""
    write_results(out_dir, suite, data, markdown)
    if chart is not None:
        chart(data, str(out_dir))
    print(markdown)
    log(f"results in {out_dir}")


def md_note(text: Any, limit: int = 200) -> str:
    """One Markdown-table-safe line for a skip reason or an error: for a traceback tail, its last line naming
    an exception; ``|`` escaped, newlines folded, cut to ``limit`` characters."""
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    line = errors[-1] if errors else " ".join(lines)
    return line.replace("|", "/")[:limit]


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table from a header and rows of cells (converted with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def log(message: str) -> None:
    """Progress line on stderr (stdout carries only the final table)."""
    print(message, file=sys.stderr, flush=True)
