"""Ending asyncio tasks without losing a cancellation of one's own.

``task.cancel()`` followed by ``with suppress(CancelledError): await task`` has a hole: if the
caller is itself cancelled while it waits, asyncio passes that cancellation on to ``task``, the
task ends cancelled, and the suppress swallows the caller's cancellation as if it were the task's.
The caller then runs on when it was asked to stop. ``cancel_and_wait`` waits with
``asyncio.wait``, which raises the caller's cancellation and never the tasks'.

A cancellation can also arrive as another exception. ``asyncio.gather`` hands its caller the
first error of its children; when the caller is cancelled just as one child fails (a request
refused because the client closed, as it does when the operator stops), the caller gets that
error, and its cancellation is gone. ``gathered`` raises the cancellation instead, and a loop that
retries on errors calls ``stop_if_cancelled`` before it tries again. ``asyncio.gather`` also
leaves the other children running once one has failed; ``gathered`` ends them first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until each has ended.

    What a task ended with is left on it (``result()`` still raises it), but marked as seen, so
    asyncio does not log it as never retrieved.
    """
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()


def stop_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task has been asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def gathered(*awaitables: Awaitable[T]) -> list[T]:
    """``asyncio.gather``, but no child outlives the call, and the caller's cancellation is never
    lost to a child's error.

    ``asyncio.gather`` hands on the first child's error at once and leaves the others running,
    awaited by nobody: their requests go on after the caller has given up, and kopf, stopping,
    gathers every task still in the loop and raises their errors as the operator's own. So when
    a child fails, the others are cancelled and waited for before the error is handed on.
    """
    children = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return await asyncio.gather(*children)
    except Exception:
        await cancel_and_wait(*children)
        stop_if_cancelled()
        raise
