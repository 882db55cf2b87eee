"""Time and peak memory of the statistics `searchrl compare` runs over the full Search-R1 test set (51,713 questions).

    .venv/bin/python -m tests.infer.stats_bench                      # this tree's searchrl/stats.py
    .venv/bin/python -m tests.infer.stats_bench /path/to/stats.py    # another version of it (e.g. from git show)

Per call: `bootstrap_ci` of EM (0/1) and F1 (many distinct values) and `paired_comparison` of two EM columns, as
the report makes them for every run, column and contrast. Peak memory is what tracemalloc sees (numpy reports its
buffers to it).
"""

from __future__ import annotations

import importlib.util
import sys
import time
import tracemalloc
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

N = 51_713


def _load(path: str | None) -> ModuleType:
    if path is None:
        import searchrl.stats

        return searchrl.stats
    spec = importlib.util.spec_from_file_location("stats_under_test", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _measure(fn: Callable[[], Any]) -> tuple[float, float]:
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dt, peak / 1e6


def main(path: str | None) -> None:
    stats = _load(path)
    stats.mcnemar_p(3, 1)  # import scipy before timing
    rng = np.random.default_rng(1)
    em_a = (rng.random(N) < 0.40).astype(float)
    em_b = np.where(rng.random(N) < 0.8, em_a, (rng.random(N) < 0.45).astype(float))
    f1 = np.round(rng.random(N), 3) * (rng.random(N) < 0.6)
    cases = {
        "bootstrap_ci(EM)": lambda: stats.bootstrap_ci(em_a),
        "bootstrap_ci(F1)": lambda: stats.bootstrap_ci(f1),
        "paired_comparison(EM)": lambda: stats.paired_comparison(em_a, em_b),
    }
    for name, fn in cases.items():
        dt, peak = _measure(fn)
        print(f"{name:24s} n={N}  {dt * 1000:8.1f} ms  peak {peak:8.1f} MB")  # noqa: T201


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
