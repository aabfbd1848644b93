"""Work the operator hands over from kopf's handlers: each job's its own task, a bound in flight.

A creation hands its start over here and returns, and so does a deletion its stop. A burst of
thousands then waits as small tasks, each holding the job's identity and what it needs, instead
of as kopf's workers, each of which holds its handler's whole invocation (the cause, the body,
the patch, the events that arrive meanwhile) while it waits.

kopf runs a job's handlers one after another; work handed over here runs beside them, so the
job's other handlers must respect it: a stop withdraws the job's start (a queued one never runs,
one in flight is cancelled and awaited) before it stops the job, and a raised attempt waits
until the handed-over start has ended.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any, Final

import prometheus_client

JobKey = tuple[str, str]  # (namespace, name) of a DispatchJob

# Starts in flight per operator. Each holds API connections (in Kueue mode a watch for its
# Workload too): a burst of creations beyond this waits here, not in the client's connection
# pool, where the wait counts against the request timeout and times every start out.
STARTS_IN_FLIGHT: Final = 20
# Stops in flight per operator. Each deletes the job's TrainJobs and reads four kinds back until
# the garbage collector has taken everything: a burst of deletions beyond this waits here.
STOPS_IN_FLIGHT: Final = 20


# What of a kopf handler's context work handed over needs: where ``kopf.event``, ``kopf.warn`` and
# the object loggers post Kubernetes Events (kopf sets these for each object before its handlers
# run). The rest is the handler's invocation, its cause among it (the body, the patch, the memo),
# which a task made in that context, or its done callback, would keep while the work waits.
POSTING_VARS: Final = frozenset({"settings_var", "event_queue_var", "event_queue_loop_var"})


def posting_context() -> contextvars.Context:
    """A context holding only kopf's posting variables, as the current context has them."""
    kept = contextvars.Context()
    for var, value in contextvars.copy_context().items():
        if var.name in POSTING_VARS:
            kept.run(var.set, value)
    return kept


class HandedOver:
    """Handed-over work by DispatchJob, and the bound in flight it all shares.

    ``what`` names the work in its tasks' names; ``pending`` counts the tasks not yet ended.
    """

    def __init__(self, what: str, bound: int, pending: prometheus_client.Gauge) -> None:
        self.what = what
        self.gate = asyncio.Semaphore(bound)
        self.pending = pending
        self._tasks: dict[JobKey, asyncio.Task[None]] = {}

    def hand_over(self, key: JobKey, work: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``work`` as the job's task; False, running nothing, if one is already there."""
        if key in self._tasks:
            return False
        name = f"{self.what} of DispatchJob {key[0]}/{key[1]}"
        context = posting_context()
        task = asyncio.create_task(work(), name=name, context=context)
        self._tasks[key] = task
        self.pending.inc()
        task.add_done_callback(lambda done: self._forget(key, done), context=context)
        return True

    def holds(self, key: JobKey) -> bool:
        """Whether the job's handed-over work is still queued or in flight."""
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    async def withdraw(self, key: JobKey) -> bool:
        """End the job's handed-over work: queued, it never runs; in flight, it is cancelled.

        Returns once the task has ended, so nothing of the work happens afterwards; False if the
        job had none.
        """
        task = self._tasks.pop(key, None)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait({task})
        return True

    async def join(self) -> None:
        """Wait until all work handed over so far, and any handed over meanwhile, has ended."""
        while self._tasks:
            await asyncio.wait(set(self._tasks.values()))

    async def close(self) -> None:
        """Withdraw all handed-over work (the operator is stopping)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _forget(self, key: JobKey, done: asyncio.Task[None]) -> None:
        self.pending.dec()
        if self._tasks.get(key) is done:
            del self._tasks[key]


# Stopped jobs remembered, so that their late events (kopf lags behind a burst) do not stop them
# again: a redundant stop costs a delete and four lists, and finds nothing.
ENDED_KEPT: Final = 10_000


class Ended:
    """The uids of the jobs whose handed-over work is done, the latest ``kept`` of them."""

    def __init__(self, kept: int = ENDED_KEPT) -> None:
        self.kept = kept
        self._uids: dict[str, None] = {}

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        while len(self._uids) > self.kept:
            del self._uids[next(iter(self._uids))]

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids
