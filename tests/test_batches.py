"""searchrl/batches.py: every caller of a batch is answered, with its own result or the batch's error."""

from __future__ import annotations

import asyncio

from searchrl.batches import run_batch


def test_each_future_gets_its_result_and_a_cancelled_one_is_left_alone() -> None:
    async def go() -> list[object]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        futures[1].cancel()  # its caller gave up while the batch ran
        await run_batch(futures, lambda: ["a", "b", "c"])
        return [f.result() if not f.cancelled() else "cancelled" for f in futures]

    assert asyncio.run(go()) == ["a", "cancelled", "c"]


def test_a_batch_that_raises_gives_every_waiting_caller_the_error() -> None:
    def fails() -> list[str]:
        raise RuntimeError("out of memory")

    async def go() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(2)]
        await run_batch(futures, fails)
        return [f.exception() for f in futures]

    errors = asyncio.run(go())
    assert all(isinstance(e, RuntimeError) and str(e) == "out of memory" for e in errors)
