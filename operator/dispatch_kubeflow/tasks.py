"""Ending asyncio tasks without losing a cancellation of one's own.

``task.cancel()`` followed by ``with suppress(CancelledError): await task`` has a hole: if the
caller is itself cancelled while it waits, asyncio passes that cancellation on to ``task``, the
task ends cancelled, and the suppress swallows the caller's cancellation as if it were the task's.
The caller then runs on when it was asked to stop. ``cancel_and_wait`` waits with
``asyncio.wait``, which raises the caller's cancellation and never the tasks'.
"""

from __future__ import annotations

import asyncio
from typing import Any


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
