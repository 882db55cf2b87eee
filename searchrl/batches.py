"""One batch of queued requests run in a worker thread, each request's future settled with its share of the result.

Both in-process generation servers batch this way: infer/local.py (`--engine local`, the eval's HF model) and
trainer/cpu/hf_rollout.py (the CPU loop's rollout server). Their drainers take a batch off the queue, run the
synchronous batch call off the event loop, and must answer every caller: a result each, or the batch's error each,
so no caller waits forever and the drainer goes on with the queue. A future already done (its caller cancelled,
or an abort answered it) is left as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

_T = TypeVar("_T")


async def run_batch(futures: Sequence[asyncio.Future[_T]], call: Callable[[], list[_T]]) -> None:
    """Run `call()` in a thread; give the i-th future the i-th result, or every future the exception it raised."""
    try:
        results = await asyncio.to_thread(call)
    except Exception as exc:  # every caller of the batch gets the error, none waits forever
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        return
    for future, result in zip(futures, results, strict=True):
        if not future.done():
            future.set_result(result)


__all__ = ["run_batch"]
