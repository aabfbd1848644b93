"""``cancel_and_wait`` and ``gathered``: the caller's own cancellation is never lost, neither
swallowed as a task's nor handed on as a child's error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch_kubeflow.tasks import cancel_and_wait, gathered, stop_if_cancelled


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


class Closed(Exception):
    """What a request raises when its client has closed under it."""


async def cancelled_as_a_child_fails(gather: Any) -> asyncio.Task[None]:
    """A caller of ``gather`` cancelled after one child failed, before gather has seen it.

    The child fails in one step of the loop; gather hears of it in a later one (a done callback),
    and the caller's cancellation comes between: as when the operator, stopping, closes the API
    client (a read fails) and then cancels the stop that made the read.
    """
    failing = asyncio.Event()

    async def fails() -> None:
        await failing.wait()
        raise Closed("Connector is closed.")

    async def caller() -> None:
        await gather(fails(), asyncio.Event().wait())

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the caller waits in gather
    failing.set()
    await asyncio.sleep(0)  # the child has failed; gather's callback is queued behind this task
    task.cancel()
    await asyncio.wait({task})
    return task


async def test_asyncio_gather_hands_on_the_childs_error_in_place_of_the_cancellation() -> None:
    """Why ``gathered`` exists: this is the race it closes."""
    task = await cancelled_as_a_child_fails(asyncio.gather)
    assert not task.cancelled()
    assert isinstance(task.exception(), Closed)


async def test_gathered_raises_the_callers_cancellation_even_as_a_child_fails() -> None:
    task = await cancelled_as_a_child_fails(gathered)
    assert task.cancelled()


async def test_gathered_hands_on_a_childs_error_when_nobody_cancelled() -> None:
    async def fails() -> None:
        raise Closed("refused")

    with pytest.raises(Closed):
        await gathered(fails(), asyncio.sleep(0))
    assert await gathered(asyncio.sleep(0, "a"), asyncio.sleep(0, "b")) == ["a", "b"]


async def a_child_fails_then_another(gather: Any) -> list[asyncio.Task[Any]]:
    """The children ``gather`` ran for a call in which one child failed at once and another
    was still waiting for its answer, as the first raised."""
    answered = asyncio.Event()

    async def fails() -> None:
        raise Closed("Connector is closed.")

    async def fails_once_answered() -> None:
        await answered.wait()
        raise Closed("Connector is closed.")

    before = asyncio.all_tasks()
    with pytest.raises(Closed):
        await gather(fails(), fails_once_answered())
    children = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    answered.set()
    await asyncio.sleep(0)
    return children


async def test_asyncio_gather_leaves_the_other_children_running_after_an_error() -> None:
    """Why ``gathered`` ends them: the child left behind fails later, awaited by nobody, and
    kopf, stopping, raises such a leftover task's error as the operator's own."""
    children = await a_child_fails_then_another(asyncio.gather)
    assert len(children) == 1
    assert isinstance(children[0].exception(), Closed)


async def test_gathered_ends_every_child_before_it_hands_on_an_error() -> None:
    children = await a_child_fails_then_another(gathered)
    assert children == []


async def test_stop_if_cancelled_raises_only_in_a_task_asked_to_stop() -> None:
    stop_if_cancelled()  # not asked: nothing happens
    checked: list[str] = []

    async def swallows_its_cancellation() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            checked.append("swallowed")
        stop_if_cancelled()
        checked.append("went on")

    task = asyncio.create_task(swallows_its_cancellation())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task})
    assert task.cancelled()
    assert checked == ["swallowed"]
