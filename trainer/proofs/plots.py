"""The proof runs' figures: matplotlib's headless setup and the writing of a figure, in one place.

Each run draws its own figure (learn.py's reward curve and modes, real_learn.py's curve, learn_search.py's reward
per step); what they share is here, so a change of backend, resolution or folder handling is made once (issue 54
item 2: "one plots module"). matplotlib is imported only when a figure is drawn: the runs' other code and the CLI
start without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 110  # the figures docs/cpu-proofs.md shows: readable on a laptop screen, ~100 kB a PNG


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: the runs draw on machines without a display (CI, a remote box)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_axis(ax: Any, label: str) -> None:
    """Label `ax`'s x axis, the runs' GRPO steps, and tick it at whole steps only (matplotlib's own ticks fall
    between steps on a short run)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(label)


def png(fig: Any) -> bytes:
    """Lay `fig` out, render it as PNG and free it: the bytes a run writes into its own file (the run names its
    files; this module never sees a path)."""
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return buffer.getvalue()


def save(fig: Any, path: Path) -> Path:
    """`png(fig)` written to `path` (its folder made if missing); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(fig))
    return path


__all__ = ["DPI", "png", "pyplot", "save", "step_axis"]
