"""Freed heap memory goes back to the OS (retrieval/heap.py, issue 24 item 4)."""

from __future__ import annotations

import json
import subprocess
import sys

from searchrl.retrieval.heap import HeapTrimmer

# Fragment the heap the way batches of every size do: 200 MB of 2 KB blocks, every 50th kept alive. glibc can
# return none of it by itself (live blocks sit between the free ones), malloc_trim(0) can.
_FRAGMENT = """
import json, os
from searchrl.bench.procfs import process_memory
from searchrl.retrieval.heap import trim_heap
blocks = [bytes(2048) for _ in range(100_000)]
kept = blocks[::50]
del blocks
before = process_memory(os.getpid())["anon_mb"]
trimmed = trim_heap()
after = process_memory(os.getpid())["anon_mb"]
print(json.dumps({"before": before, "after": after, "trimmed": trimmed, "kept": len(kept)}))
"""


def test_trim_heap_returns_freed_fragmented_memory() -> None:
    done = subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["trimmed"] is True
    assert got["before"] > 150  # freed, but still resident: what the service's RSS showed
    assert got["before"] - got["after"] > 100, got


def test_trimmer_trims_when_settled_and_at_most_every_interval_while_busy() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(interval_s=0.2, trim=lambda: calls.append(1) or True)
    assert trimmer(settled=False) is False  # busy, and the interval has not passed since start-up
    assert trimmer(settled=True) is True  # a burst is over: always
    assert trimmer(settled=False) is False
    import time

    time.sleep(0.25)
    assert trimmer(settled=False) is True  # busy for longer than the interval
    assert trimmer(settled=False) is False
    assert len(calls) == trimmer.trims == 2
