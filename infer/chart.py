"""The comparison chart: EM per dataset per run with 95% intervals, and searches and failed questions per run.

Drawn with matplotlib (imported only here, when a report is built) for report.png and the HTML report.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from searchrl.infer.comparison import AVG, Cell, columns, run_cells
from searchrl.infer.summary import run_label

MIN_FONT = 9  # points: legend, tick labels and annotations stay readable when the PNG is shrunk into a page


def chart_figure(
    runs: Sequence[dict[str, Any]], *, title: str | None = None, banner: Sequence[str] = ()
) -> Any:
    """matplotlib Figure: EM per dataset (and Avg.) per run with 95% intervals; searches and failures per run.

    Invalid runs are hatched (and say so in the legend); an EM of 0 is drawn as a visible stub, not left out;
    the banner's differences are printed under the chart, so the picture alone does not pass for like for like.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = columns(runs)
    labels = [run_label(r) for r in runs]
    fig, (ax_em, ax_s) = plt.subplots(
        1,
        2,
        figsize=(max(9.0, 2.5 + 1.4 * len(cols) + 0.4 * len(runs)), 4.8),
        gridspec_kw={"width_ratios": [3, 1.4]},
    )
    colors = matplotlib.color_sequences["tab10"]  # the colours of plt.get_cmap("tab10"), typed as a list
    _draw_em(ax_em, runs, cols, labels, colors)
    _draw_searches(ax_s, runs, labels, colors)
    if title:
        fig.suptitle(title, fontsize=MIN_FONT + 2)
    fig.tight_layout()
    if banner:
        _draw_banner(fig, banner)
    return fig


def _invalid(run: dict[str, Any]) -> bool:
    return not run["summary"].get("valid", True)


def _em_bars(
    cells: dict[str, Cell], cols: Sequence[str], offset: float
) -> tuple[list[float], list[float], list[float], list[float]]:
    """One run's (x, EM, lower error, upper error) per column it has; a NaN interval is drawn as none."""
    xs, vals, lows, highs = [], [], [], []
    for j, col in enumerate(cols):
        cell = cells.get(col)
        if cell is None:
            continue
        xs.append(j + offset)
        vals.append(cell.em)
        lo, hi = cell.ci if cell.ci[0] == cell.ci[0] else (cell.em, cell.em)
        lows.append(max(0.0, cell.em - lo))
        highs.append(max(0.0, hi - cell.em))
    return xs, vals, lows, highs


def _draw_em(
    ax: Any, runs: Sequence[dict[str, Any]], cols: Sequence[str], labels: Sequence[str], colors: Sequence[Any]
) -> None:
    """The left panel: grouped EM bars per column, one colour a run, invalid runs hatched, 95% error bars."""
    cells = [run_cells(r) for r in runs]
    width = 0.8 / len(runs)
    stub = 0.008  # height of the stub that shows an EM of exactly 0
    for i, r in enumerate(runs):
        invalid = _invalid(r)
        xs, vals, lows, highs = _em_bars(cells[i], cols, (i - (len(runs) - 1) / 2) * width)
        color = colors[i % len(colors)]
        ax.bar(
            xs,
            [max(v, stub) for v in vals],
            width=width,
            label=labels[i] + (" (INVALID)" if invalid else ""),
            color=color,
            hatch="//" if invalid else None,
            edgecolor="black" if invalid else color,
            linewidth=0.6,
        )
        ax.errorbar(xs, vals, yerr=[lows, highs], fmt="none", ecolor="black", capsize=3, elinewidth=1)
    n_by_col = [max((c[col].n for c in cells if col in c), default=0) for col in cols]
    ax.set_xticks(
        range(len(cols)),
        [f"{c}\nn={n}" if c != AVG else "Avg." for c, n in zip(cols, n_by_col, strict=True)],
        fontsize=MIN_FONT,
    )
    ax.tick_params(axis="y", labelsize=MIN_FONT)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("exact match (95% CI)", fontsize=MIN_FONT + 1)
    ax.set_title("EM per dataset (hatched: invalid run)", fontsize=MIN_FONT + 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=MIN_FONT, loc="upper left", bbox_to_anchor=(0, -0.14), ncol=2, frameon=False)


def _draw_searches(
    ax: Any, runs: Sequence[dict[str, Any]], labels: Sequence[str], colors: Sequence[Any]
) -> None:
    """The right panel: searches per question per run, annotated with its failed questions and LLM errors."""
    for i, r in enumerate(runs):
        invalid = _invalid(r)
        s = r["summary"]
        color = colors[i % len(colors)]
        ax.barh(
            i,
            s["searches"],
            color=color,
            hatch="//" if invalid else None,
            edgecolor="black" if invalid else color,
        )
        ax.annotate(
            f"failed {s.get('questions_failed', 0)}/{s['n']}, LLM err {s.get('llm_errors', 0)}",
            (0, i),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=MIN_FONT,
        )
    ax.set_yticks(range(len(runs)), labels, fontsize=MIN_FONT)
    ax.tick_params(axis="x", labelsize=MIN_FONT)
    ax.invert_yaxis()
    ax.set_xlabel("searches per question", fontsize=MIN_FONT + 1)
    ax.set_title("Searches (and failed questions)", fontsize=MIN_FONT + 1)
    ax.grid(axis="x", alpha=0.3)


def _draw_banner(fig: Any, banner: Sequence[str]) -> None:
    """The differences between runs under the chart (the first 4, each cut to 150 characters; report.md has all)."""
    shown = [b if len(b) <= 150 else b[:147] + "..." for b in banner[:4]]
    more = [f"... and {len(banner) - 4} more (report.md)"] if len(banner) > 4 else []
    fig.text(
        0.01,
        0.0,
        "\n".join(["Not like for like:", *shown, *more]),
        ha="left",
        va="top",
        fontsize=MIN_FONT,
        color="#b3261e",
        transform=fig.transFigure,
    )


def render_chart(
    runs: Sequence[dict[str, Any]], *, title: str | None = None, banner: Sequence[str] = ()
) -> bytes:
    """PNG of `chart_figure`."""
    import matplotlib.pyplot as plt

    fig = chart_figure(runs, title=title, banner=banner)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


__all__ = ["MIN_FONT", "chart_figure", "render_chart"]
