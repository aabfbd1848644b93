"""The operator's starts of DispatchJobs: each its own task, a bounded number in flight at once.

A creation hands its start over here and returns. A burst of thousands of creations then waits
as small tasks, each holding the job's identity and spec, instead of as kopf's workers, each of
which holds its handler's whole invocation (the cause, the body, the patch) while it waits.

kopf runs a job's handlers one after another; a start handed over here runs beside them, so the
job's other handlers must respect it: a deletion withdraws the start (a queued one never runs,
one in flight is cancelled and awaited) before it stops the job, and a raised attempt waits
until the handed-over start has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

from dispatch_kubeflow import metrics

JobKey = tuple[str, str]  # (namespace, name) of a DispatchJob

# Starts in flight per operator. Each holds API connections (in Kueue mode a watch for its
# Workload too): a burst of creations beyond this waits here, not in the client's connection
# pool, where the wait counts against the request timeout and times every start out.
STARTS_IN_FLIGHT: Final = 20


class Starts:
    """Handed-over starts by DispatchJob, and the bound on starts in flight they all share."""

    def __init__(self, bound: int = STARTS_IN_FLIGHT) -> None:
        self.gate = asyncio.Semaphore(bound)
        self._tasks: dict[JobKey, asyncio.Task[None]] = {}

    def hand_over(self, key: JobKey, start: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``start`` as the job's task; False, running nothing, if one is already there."""
        if key in self._tasks:
            return False
        task = asyncio.create_task(start(), name=f"start of DispatchJob {key[0]}/{key[1]}")
        self._tasks[key] = task
        metrics.STARTS_PENDING.inc()
        task.add_done_callback(lambda done: self._forget(key, done))
        return True

    def holds(self, key: JobKey) -> bool:
        """Whether the job's handed-over start is still queued or in flight."""
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    async def withdraw(self, key: JobKey) -> bool:
        """End the job's handed-over start: a queued one never runs, one in flight is cancelled.

        Returns once the start's task has ended, so nothing of the start happens afterwards;
        False if the job had none.
        """
        task = self._tasks.pop(key, None)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait({task})
        return True

    async def join(self) -> None:
        """Wait until every start handed over so far, and any handed over meanwhile, has ended."""
        while self._tasks:
            await asyncio.wait(set(self._tasks.values()))

    async def close(self) -> None:
        """Withdraw every handed-over start (the operator is stopping)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _forget(self, key: JobKey, done: asyncio.Task[None]) -> None:
        metrics.STARTS_PENDING.dec()
        if self._tasks.get(key) is done:
            del self._tasks[key]
