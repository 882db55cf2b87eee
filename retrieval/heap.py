"""Give freed heap memory back to the OS: glibc `malloc_trim(0)`, after start-up and when the worker idles.

Why (issue 24 item 4): glibc keeps memory that the program has freed inside its malloc arenas (one per thread
that allocated, up to 8 per core), and returns it to the OS only from the top of the main heap. torch, ONNX
Runtime, numpy and the tokenizer allocate and free buffers of every size for every batch, from several
threads, so freed holes stay resident. Measured on the bundled corpus (2-core AMD EPYC): the start-up encoder
tuning (it builds, measures and drops several encoder candidates) left 691 MB of anonymous memory, and
`malloc_trim(0)` gave 178 MB of it back at once. `malloc_trim` also releases whole free pages in the middle of
every arena (glibc >= 2.8), which the automatic top-of-heap trim never does.

Only freed memory is released: nothing live is touched, so it cannot change a result. It is a no-op where the
C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_lock = threading.Lock()
_malloc_trim: Callable[[int], int] | None = None
_looked_up = False


def _trim_function() -> Callable[[int], int] | None:
    global _malloc_trim, _looked_up
    with _lock:
        if not _looked_up:
            _looked_up = True
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = libc.malloc_trim  # ctypes releases the GIL while it runs
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
                _malloc_trim = fn
            except (OSError, AttributeError):
                log.debug("this C library has no malloc_trim; freed heap memory stays with the process")
        return _malloc_trim


def trim_heap() -> bool:
    """Release free heap pages of every malloc arena to the OS; False where the C library cannot."""
    fn = _trim_function()
    if fn is None:
        return False
    fn(0)
    return True


class HeapTrimmer:
    """The batcher's idle hook (`Batcher(on_idle=...)`): trim once a burst is over, and at most every
    `interval_s` while work keeps coming.

    `settled=True`: the queue has stayed empty for the batcher's `idle_s` after a batch, so an idle replica
    gives back what its last burst freed. `settled=False`: a batch has just left the queue empty (between a
    lone client's queries, say); trimmed only if `interval_s` has passed since the last trim, so a busy
    replica pays for one trim (79 ms for 200 MB of fragmented heap here) every `interval_s` at most.
    """

    def __init__(self, *, interval_s: float = 30.0, trim: Callable[[], bool] = trim_heap) -> None:
        self.interval_s = interval_s
        self._trim = trim
        self._last = time.monotonic()
        self.trims = 0  # trims done (tests, logs)

    def __call__(self, settled: bool) -> bool:
        now = time.monotonic()
        if not settled and now - self._last < self.interval_s:
            return False
        self._last = now
        self._trim()
        self.trims += 1
        return True


__all__ = ["HeapTrimmer", "trim_heap"]
