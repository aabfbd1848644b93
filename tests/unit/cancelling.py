"""A call whose cancellation arrives as an error, as a request's does when the operator closes its
API clients while it cancels the tasks using them.

A real apiserver cannot be made to fail a request at the moment of a cancellation, so the tests of
what a loop does then use this stand-in.
"""

from __future__ import annotations

import asyncio
from typing import Any


class FailsWhenCancelled:
    """A call that waits until it is cancelled, then fails with ``error`` instead; a call after
    the first ends cancelled, so a loop that did go on can still be stopped."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0
        self.waiting = asyncio.Event()

    async def __call__(self, *_: Any, **__: Any) -> Any:
        self.calls += 1
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.calls > 1:
                raise
            raise self.error from None
        raise AssertionError("only a cancellation ends the wait")
