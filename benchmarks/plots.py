"""PNG charts of benchmark results (matplotlib, imported lazily; extra ``bench``)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import log, plain_number


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("charts skipped: matplotlib is not installed (pip install taskfit[bench])")
        return None
    return plt


def grouped_bars(
    path: str | Path,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    *,
    ylabel: str,
    title: str,
    subtitle: str = "",
    baseline: float | None = None,
    errors: dict[str, Sequence[tuple[float, float] | None]] | None = None,
) -> Path | None:
    """Grouped bar chart: one group per entry of ``groups``, one bar per ``series`` key (None = no bar).

    Args:
        path: PNG file to write.
        groups: x-axis group labels.
        series: bar label -> one value per group.
        ylabel, title, subtitle: axis label, title and a smaller second title line (machine label).
        baseline: draw a dashed horizontal line at this value (e.g. 1.0 for ratios).
        errors: bar label -> per group ``(low, high)`` absolute values drawn as min-max whiskers.

    Returns:
        The path written, or None when matplotlib is missing.
    """
    plt = _pyplot()
    if plt is None:
        return None
    n = max(1, len(series))
    width = 0.8 / n
    # a readable page-width figure however many groups: about 0.7 inch a group, 6 to 11 inches wide, 4:7 at most
    many = len(groups) > 4
    width_in = min(11.0, max(6.0, 0.7 * len(groups) * max(1, n) ** 0.5 + 2))
    fig, ax = plt.subplots(figsize=(width_in, 5.2 if many else 4.4))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        pts = [(x, v) for x, v in zip(xs, values) if v is not None]
        if not pts:
            continue
        bars = ax.bar([p[0] for p in pts], [p[1] for p in pts], width, label=label)
        tops = [v for _, v in pts]
        if errors and errors.get(label):
            errs = [e for e, v in zip(errors[label], values) if v is not None]
            lo = [max(0.0, v - (e[0] if e else v)) for (_, v), e in zip(pts, errs)]
            hi = [max(0.0, (e[1] if e else v) - v) for (_, v), e in zip(pts, errs)]
            ax.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=[lo, hi],
                fmt="none",
                ecolor="black",
                capsize=3,
                linewidth=1,
            )
            tops = [max(v, e[1]) if e else v for (_, v), e in zip(pts, errs)]
        for bar, top, (_, v) in zip(bars, tops, pts):
            ax.annotate(
                plain_number(v),
                (bar.get_x() + bar.get_width() / 2, top),  # above the whisker, not across it
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_ylabel(ylabel)
    chars = int(width_in * 11)  # characters a line of 9-point text holds across the figure
    ax.set_title("\n".join([*textwrap.wrap(title, chars), *textwrap.wrap(subtitle, int(chars * 1.15))]), fontsize=9)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)  # 1000, not 1e3 or an offset
    ax.margins(y=0.12)  # room for the value labels above the bars
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # nothing clipped: the canvas grows to the labels
    plt.close(fig)
    return path
