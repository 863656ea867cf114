"""Training curves as PNG: every logged scalar against ``global_step``, training and evaluation values of the
same quantity on one panel, drawn from a run's ``metrics.csv`` (written by :class:`~taskfit.loggers.CSVLogger`).

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
_SKIP_SUFFIXES = ("_runtime", "_per_second", "_preparation_time", "epoch")  # speed and bookkeeping: not curves


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
    """Rows of a ``metrics.csv`` with their numeric cells as floats (empty cells left out), without the rows that an
    evaluation outside ``fit`` appended after training (see :func:`training_rows`)."""
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
    return training_rows(rows)


def training_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without those logged at a step below one already seen: a training run's steps never go back (a
    resumed run rewrites its log from the checkpoint on), so such rows come from an evaluation appended later by a
    fresh run at step 0 (``taskfit validate`` before it logged into its own folder) and are no curve points."""
    kept, top = [], -math.inf
    for row in rows:
        if row["step"] >= top:
            kept.append(row)
            top = row["step"]
    return kept


#: stage prefixes that name the same quantity in training and evaluation (``train_acc`` / ``val_acc``)
_STAGES = ("train_", "eval_", "validation_", "valid_", "val_", "test_")


def quantity(name: str) -> str:
    """The quantity a logged name measures, without its stage prefix: ``eval_loss`` -> ``loss``, ``val_acc``
    and ``train_acc`` -> ``acc``; other names are their own quantity (``learning_rate``)."""
    for prefix in _STAGES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return name


def _series(rows: list[dict[str, Any]], name: str) -> list[tuple[float, float]]:
    points = []
    for row in rows:
        value = row.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or (
                name.startswith("test_") and row["step"] == 0):  # fit.test() before training: not a curve point
            continue
        points.append((row["step"], float(value)))
    return sorted(points)


def curve_names(rows: list[dict[str, Any]]) -> list[str]:
    """Every logged scalar worth a curve, panel by panel (see :func:`panels`)."""
    return [name for _, names in panels(rows) for name in names]


def panels(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The panels to draw: ``(quantity, names)`` pairs. Every logged scalar is drawn except bookkeeping
    (``step``, ``epoch``, ``total_flos``, ``*_runtime``, ``*_per_second``, ``*_preparation_time``) and constant series (two or more
    points, all equal); names of one quantity share a panel (``loss`` with ``eval_loss``, ``train_acc`` with
    ``val_acc``). Points a ``fit.test()`` logged before training (step 0) are left out. Order: ``loss``,
    ``learning_rate``, then the other quantities sorted."""
    keys = sorted({k for row in rows for k in row} - {"step", "total_flos"})
    groups: dict[str, list[str]] = {}
    for name in keys:
        if name.endswith(_SKIP_SUFFIXES):
            continue
        points = _series(rows, name)
        if not points or (len(points) > 1 and len({v for _, v in points}) == 1):
            continue
        groups.setdefault(quantity(name), []).append(name)
    first = [q for q in ("loss", "learning_rate") if q in groups]
    order = first + sorted(q for q in groups if q not in first)
    # within a panel: the training series first, then evaluation, then test
    rank = {"eval_": 1, "validation_": 1, "valid_": 1, "val_": 1, "test_": 2}
    return [(q, sorted(groups[q], key=lambda n: (next((r for p, r in rank.items() if n.startswith(p)), 0), n)))
            for q in order]


def plot_history(rows: list[dict[str, Any]], out_path: str, title: str | None = None) -> str:
    """Draw one panel per :func:`panels` entry (values against ``step``, one line per name) into ``out_path``
    (PNG).

    Args:
        rows (list[dict]): logged rows, each with ``step`` (global_step) and metric values (e.g.
            ``fit.state.log_history`` or :func:`read_metrics_csv` output).
        out_path (str): PNG file to write (its folder is created).
        title (str | None): figure title.

    Returns:
        str: ``out_path``.

    Raises:
        ModuleNotFoundError: matplotlib is missing (extra ``plots``).
        ValueError: no row has a scalar that changes over the run.
    """
    require("matplotlib", "plots", "Plotting training curves")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn = panels(rows)
    if not drawn:
        raise ValueError("Nothing to plot: no logged scalar changes over the run.")
    cols = min(3, len(drawn))
    nrows = math.ceil(len(drawn) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title_q, names) in enumerate(drawn):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for name in names:
            points = _series(rows, name)
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.2, label=name)
        ax.set_title(title_q, fontsize=10)
        ax.set_xlabel("global step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(names) > 1 or names[0] != title_q:
            ax.legend(fontsize=7)
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
