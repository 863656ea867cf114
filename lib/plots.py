"""Training curves as PNG (F-OBS-3): training loss, learning rate and every evaluation metric against
``global_step``, drawn from a run's ``metrics.csv`` (written by :class:`~taskfit.loggers.CSVLogger`).

Used at the end of ``Fit.fit`` (the CSV logger draws ``training_curves.png`` next to ``metrics.csv`` when
matplotlib is installed) and by ``taskfit plot RUN_DIR``. matplotlib (extra ``plots``) is imported only here,
and only the object-oriented Agg canvas is used (no pyplot state, no display needed).
"""

from __future__ import annotations

import csv
import math
import os
from typing import Any

from taskfit.loggers.logger import require

PNG_NAME = "training_curves.png"
#: speed and bookkeeping columns that are not curves worth drawing
_SKIP_SUFFIXES = ("_runtime", "_per_second", "epoch")


def find_metrics_csv(run_dir: str) -> str:
    """``metrics.csv`` of a run: ``run_dir`` itself when it is the CSV, else ``run_dir/metrics.csv`` or
    ``run_dir/logs/metrics.csv`` (the default ``logging_dir`` under ``output_dir``).

    Raises:
        FileNotFoundError: none of these exists (names the paths tried).
    """
    tried = [run_dir] if run_dir.endswith(".csv") else [os.path.join(run_dir, "metrics.csv"),
                                                          os.path.join(run_dir, "logs", "metrics.csv")]
    for path in tried:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"No metrics.csv for {run_dir!r}: tried {tried}. Train with report_to including 'csv'.")


def read_metrics_csv(path: str) -> list[dict[str, float]]:
    """Rows of a ``metrics.csv`` with their numeric cells as floats (empty cells left out)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for k, v in raw.items():
                try:
                    row[k] = float(v)
                except (TypeError, ValueError):
                    continue
            if "step" in row:
                rows.append(row)
    return rows


def curve_names(rows: list[dict[str, Any]]) -> list[str]:
    """The panels to draw, in order: ``loss``, ``learning_rate``, then every ``eval_*`` / ``test_*`` metric
    (speed metrics such as ``eval_runtime`` and ``eval_samples_per_second`` left out), sorted."""
    keys = {k for row in rows for k in row}
    names = [k for k in ("loss", "learning_rate") if k in keys]
    names += sorted(k for k in keys if k.startswith(("eval_", "test_")) and not k.endswith(_SKIP_SUFFIXES))
    return names


def plot_history(rows: list[dict[str, Any]], out_path: str, title: str | None = None) -> str:
    """Draw one panel per :func:`curve_names` entry (value against ``step``) into ``out_path`` (PNG).

    Args:
        rows (list[dict]): logged rows, each with ``step`` (global_step) and metric values (e.g.
            ``fit.state.log_history`` or :func:`read_metrics_csv` output).
        out_path (str): PNG file to write (its folder is created).
        title (str | None): figure title.

    Returns:
        str: ``out_path``.

    Raises:
        ModuleNotFoundError: matplotlib is missing (extra ``plots``).
        ValueError: no row has a loss, learning rate or evaluation metric to draw.
    """
    require("matplotlib", "plots", "Plotting training curves")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = curve_names(rows)
    if not names:
        raise ValueError("Nothing to plot: no row has 'loss', 'learning_rate' or an eval_/test_ metric.")
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    for i, name in enumerate(names):
        ax = fig.add_subplot(nrows, cols, i + 1)
        points = sorted((row["step"], row[name]) for row in rows if isinstance(row.get(name), (int, float)))
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("global step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, format="png")
    return out_path


def plot_run(run_dir: str, out_path: str | None = None) -> str:
    """Redraw a run's curves from its ``metrics.csv`` (``taskfit plot RUN_DIR``).

    Args:
        run_dir (str): the logging folder, the output folder above ``logs/``, or the CSV file itself.
        out_path (str | None): PNG to write; default ``training_curves.png`` next to ``metrics.csv``.

    Returns:
        str: the PNG path.

    Raises:
        FileNotFoundError: no ``metrics.csv`` found. ModuleNotFoundError: matplotlib missing (extra ``plots``).
        ValueError: nothing to draw.
    """
    path = find_metrics_csv(run_dir)
    out = out_path or os.path.join(os.path.dirname(path), PNG_NAME)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) == "logs":  # the default logging_dir: name the run after its output_dir
        folder = os.path.dirname(folder)
    return plot_history(read_metrics_csv(path), out, title=f"{os.path.basename(folder)} (from {path})")


def main(argv: list[str] | None = None) -> int:
    """``taskfit plot RUN_DIR [--output PNG]``: print the PNG path; exit status 2 on a missing CSV, a missing
    matplotlib or nothing to draw (the message says which)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="taskfit plot", description="Redraw a run's training curves (PNG) "
                                     "from its metrics.csv.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="output_dir, logging_dir or a metrics.csv path")
    parser.add_argument("--output", metavar="PNG", help="file to write (default: training_curves.png next to "
                        "metrics.csv)")
    ns = parser.parse_args(argv)
    try:
        print(plot_run(ns.run_dir, ns.output))
    except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:
        print(f"taskfit plot: error: {err}", file=sys.stderr)
        return 2
    return 0
