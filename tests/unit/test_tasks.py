"""``cancel_and_wait``: the caller's own cancellation is never swallowed as the task's."""

from __future__ import annotations

import asyncio

import pytest

from dispatch_kubeflow.tasks import cancel_and_wait


async def test_a_caller_cancelled_while_it_waits_stays_cancelled() -> None:
    inner = asyncio.create_task(asyncio.Event().wait())
    went_on = asyncio.Event()

    async def stopper() -> None:
        await cancel_and_wait(inner)
        went_on.set()  # only reached if the caller's cancellation was lost

    caller = asyncio.create_task(stopper())
    await asyncio.sleep(0)  # the caller has cancelled ``inner`` and now waits for it to end
    assert not inner.done()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not went_on.is_set()
    assert inner.cancelled()


async def test_every_task_has_ended_when_it_returns() -> None:
    ended: list[str] = []

    async def slow_to_stop(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            ended.append(name)

    tasks = [asyncio.create_task(slow_to_stop(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    await cancel_and_wait(*tasks)
    assert sorted(ended) == ["a", "b"]
    assert all(t.done() for t in tasks)


async def test_a_task_that_failed_keeps_its_error_for_result() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    with pytest.raises(ValueError, match="broken"):
        task.result()


async def test_nothing_to_wait_for_returns_at_once() -> None:
    await cancel_and_wait()
