"""Reporting: successive derived statuses become transitions, each reported once.

The last reported position of each (job, attempt) is a small record (``ReportedRecord``) kept
outside the process (``ReportStore``), so a restarted adapter neither repeats nor loses a
transition: ``advance`` computes the transitions between the record and a derived status, and
``Reporter`` hands each ``Transition`` (its events and the record after them) to the store's
``commit``. Nothing counts as reported until a commit succeeded: a failed one leaves the record
as it was, and the same transition, with the same event ids, comes again.

Where a transition's effect lives decides the guarantee. A store that keeps the effect with the
record (``effects_committed``: the operator's DispatchJob status holds both) is committed before
the events are handed on, and each transition takes effect exactly once. A store that keeps
only the record (the TrainJob annotation, memory) is committed after the consumer has taken the
events, so a consumer that dies in between sees them again: at-least-once, with each event's
``id`` (``<job>/<attempt>/<sequence>``) the same every time, to deduplicate on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from dispatch_kubeflow.constants import Cause, EventType, State
from dispatch_kubeflow.events import DerivedStatus, DispatchEvent, Evidence


class ReportedRecord(BaseModel):
    """How far the events of one (job, attempt) have been reported; stored as short JSON."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    submitted: bool = Field(default=False, alias="s")
    # Evictions reported so far; Admitted and Running are reported once per admission epoch.
    epoch: int = Field(default=0, alias="e")
    eviction: str | None = Field(default=None, alias="x")
    admitted: int = Field(default=-1, alias="a")
    running: int = Field(default=-1, alias="r")
    restarts: int = Field(default=0, alias="ra")
    # Records written before losses were told apart: "<epoch>/<restart attempt>" of the one
    # NodeLost reported. Read, never written.
    node_lost: str | None = Field(default=None, alias="n")
    # The node losses the last NodeLost was about, as digests (``loss_digest``), comma-separated.
    losses: str | None = Field(default=None, alias="l")
    finished: bool = Field(default=False, alias="f")
    # The phase last reported in and the causes its events carried, as "<phase>:<cause>,...";
    # absent from records written before causes were tracked.
    causes: str | None = Field(default=None, alias="c")
    # Events reported so far: the sequence number in the next event's id is one more.
    sequence: int = Field(default=0, alias="q")

    def causes_in(self, phase: str) -> frozenset[str] | None:
        """The causes reported in ``phase``; None when the record predates cause tracking."""
        if self.causes is None:
            return None
        reported_phase, _, causes = self.causes.partition(":")
        return frozenset(causes.split(",")) if reported_phase == phase else frozenset()

    def losses_reported(self, epoch: int, restart_attempt: int) -> frozenset[str] | None:
        """Digests of the losses reported last; None for a record from before they were kept
        whose one NodeLost was of this epoch and restart attempt (what it saw is reported)."""
        if self.losses is not None:
            return frozenset(self.losses.split(","))
        if self.node_lost == f"{epoch}/{restart_attempt}":
            return None
        return frozenset()

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=True)

    @classmethod
    def from_json(cls, text: str | None) -> ReportedRecord | None:
        """The record in ``text``, or None when it is absent or unreadable (reported nothing)."""
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValueError:
            return None


class ReportStore(Protocol):
    """Where the last reported record of each (job, attempt) outlives the process.

    ``commit`` stores ``record`` (and, where ``effects_committed``, the effect of ``events``)
    at once, or raises and stores nothing.
    """

    @property
    def effects_committed(self) -> bool: ...

    async def load(self, job: str, attempt: int) -> ReportedRecord | None: ...

    async def commit(
        self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
    ) -> None: ...


@runtime_checkable
class ListingReportStore(ReportStore, Protocol):
    """A store that can also name the jobs it holds unfinished records of.

    A store outside the TrainJob (the DispatchJob status) implements this, so that a job whose
    objects all vanished while nothing watched still gets its ``Vanished``.
    """

    async def unfinished(self) -> list[tuple[str, int]]: ...


class MemoryStore:
    """A ReportStore that lives as long as the process: for tests and the library default."""

    effects_committed = False

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], ReportedRecord] = {}

    async def load(self, job: str, attempt: int) -> ReportedRecord | None:
        return self.records.get((job, attempt))

    async def commit(
        self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
    ) -> None:
        self.records[(job, attempt)] = record


_NO_CAUSE = "-"
# Causes that explain why a job waits; every other cause comes with an event of its own
# (Evicted, NodeLost, Restarted, Finished), and a cleared cause shows on the next event.
WAITING_CAUSES = frozenset({Cause.NO_CAPACITY, Cause.IMAGE_PULL, Cause.CONFIG_ERROR, Cause.STOPPED})
_PHASE_EVENTS = {"S": EventType.SUBMITTED, "A": EventType.ADMITTED, "R": EventType.RUNNING}


def _phase_of(status: DerivedStatus, epoch: int) -> str:
    """Where a non-terminal job is: admission epoch, gang incarnation, waiting/admitted/running."""
    step = "R" if status.admitted and status.running else "A" if status.admitted else "S"
    return f"{epoch}.{status.restart_attempt}.{step}"


def _cause_key(cause: Cause | None) -> str:
    return cause.value if cause is not None else _NO_CAUSE


def loss_digest(epoch: int, evidence: Evidence) -> str:
    """A short name for one node loss: the node (or pod, or Workload) and what said it was lost,
    the taint's key and the time it was added; a loss in a new admission epoch is a new one."""
    identity = "|".join(
        str(part or "")
        for part in (
            epoch,
            evidence.kind,
            evidence.name,
            evidence.field,
            evidence.reason,
            evidence.taint_key,
            evidence.time_added,
        )
    )
    return hashlib.blake2b(identity.encode(), digest_size=4).hexdigest()


def _losses(status: DerivedStatus, epoch: int) -> dict[str, Evidence]:
    """The node losses ``status`` shows, by digest; none unless its cause is NodeLost."""
    if status.cause is not Cause.NODE_LOST:
        return {}
    return {loss_digest(epoch, e): e for e in status.evidence}


def _new_first(new: Iterable[Evidence], evidence: tuple[Evidence, ...]) -> tuple[Evidence, ...]:
    first = tuple(new)
    return (*first, *(e for e in evidence if e not in first))


def advance(
    *,
    job: str,
    attempt: int,
    train_job: str | None,
    record: ReportedRecord | None,
    status: DerivedStatus,
    now: datetime,
) -> tuple[list[DispatchEvent], ReportedRecord]:
    """The transitions from ``record`` to ``status`` not yet reported, in order, and the new record.

    Order: Submitted, Evicted, Admitted, Running, NodeLost, Restarted, Finished or Vanished; an
    eviction seen in the same step as an admission came before it (the admission is a readmission).
    Nothing is reported after Finished or Vanished.

    A waiting cause (``WAITING_CAUSES``) that a non-terminal job takes on without any of these
    transitions (quota runs out, pods turn unschedulable or cannot pull their image) is reported
    as a repeat of the event of the job's phase (``Submitted`` while it waits for admission,
    ``Admitted``, ``Running``), once per distinct cause and phase.
    """
    rec = record or ReportedRecord()
    if rec.finished:
        return [], rec
    vanished = status.state is State.UNKNOWN and status.cause is Cause.EVIDENCE_LOST
    if vanished and not rec.submitted:
        return [], rec  # nothing was ever reported of a job that was never seen

    def event(type_: EventType, **overrides: Any) -> DispatchEvent:
        fields: dict[str, Any] = {
            "type": type_,
            "job": job,
            "attempt": attempt,
            "train_job": train_job,
            "time": now,
            "state": status.state,
            "cause": status.cause,
            "reason": status.reason,
            "message": status.message,
            "evidence": status.evidence,
        }
        fields.update(overrides)
        return DispatchEvent(**fields)

    events: list[DispatchEvent] = []
    updates: dict[str, Any] = {}
    if not rec.submitted:
        events.append(event(EventType.SUBMITTED))
        updates["submitted"] = True
    epoch = rec.epoch
    if status.eviction_token is not None and status.eviction_token != rec.eviction:
        eviction = status.eviction
        if eviction is None:
            events.append(event(EventType.EVICTED))
        else:
            others = tuple(e for e in status.evidence if e != eviction)
            events.append(
                event(
                    EventType.EVICTED,
                    reason=eviction.reason or "",
                    message=eviction.message or "",
                    evidence=(eviction, *others),
                )
            )
        epoch += 1
        updates.update(eviction=status.eviction_token, epoch=epoch)
    # Admitted and Running are reported once per admission epoch (a readmission starts one).
    if status.admitted and rec.admitted < epoch:
        events.append(event(EventType.ADMITTED))
        updates["admitted"] = epoch
    if status.admitted and status.running and rec.running < epoch:
        events.append(event(EventType.RUNNING))
        updates["running"] = epoch
    # Each distinct loss once: node A lost and back, then node B lost, is two NodeLost events.
    losses = _losses(status, epoch)
    reported_losses = rec.losses_reported(epoch, status.restart_attempt)
    # None: an older record, whose one NodeLost was about what is seen now (adopted, unreported).
    known = frozenset(losses) if reported_losses is None else reported_losses
    new_losses = [e for digest, e in losses.items() if digest not in known]
    if new_losses or reported_losses is None:
        updates.update(losses=",".join(sorted(losses)), node_lost=None)
    if new_losses:
        evidence = _new_first(new_losses, status.evidence)
        first = evidence[0]
        events.append(
            event(
                EventType.NODE_LOST,
                reason=first.reason or "",
                message=first.message or "",
                evidence=evidence,
            )
        )
    if status.restart_attempt > rec.restarts:
        events.append(event(EventType.RESTARTED))
        updates["restarts"] = status.restart_attempt
    if status.finished:
        events.append(
            event(
                EventType.VANISHED if vanished else EventType.FINISHED,
                result=status.result,
            )
        )
        updates["finished"] = True
    else:
        phase = _phase_of(status, epoch)
        cause = _cause_key(status.cause)
        reported = rec.causes_in(phase)
        if reported is None and not events:
            # A record written before causes were tracked: its events carried the current cause
            # as far as anyone can tell, so the cause is adopted without a report.
            return events, rec.model_copy(update={**updates, "causes": f"{phase}:{cause}"})
        reported = reported or frozenset()
        if not events and status.cause in WAITING_CAUSES and cause not in reported:
            events.append(event(_PHASE_EVENTS[phase[-1]]))
        if events:
            updates["causes"] = f"{phase}:{','.join(sorted(reported | {cause}))}"
    if events:
        events = [
            e.model_copy(update={"id": f"{job}/{attempt}/{rec.sequence + n}"})
            for n, e in enumerate(events, start=1)
        ]
        updates["sequence"] = rec.sequence + len(events)
    return events, rec.model_copy(update=updates) if updates else rec


@dataclass(frozen=True)
class Transition:
    """What one (job, attempt) reports next: its events, and its record once they are reported."""

    job: str
    attempt: int
    events: list[DispatchEvent]
    record: ReportedRecord


class Reporter:
    """Applies ``advance`` per (job, attempt), keeping the records in memory and in the store.

    ``next_transition`` computes; ``commit`` stores. The record kept in memory moves only when a
    commit succeeded, so after a failure the next derivation gives the same transition again.
    """

    def __init__(self, store: ReportStore) -> None:
        self._store = store
        self._records: dict[tuple[str, int], ReportedRecord] = {}

    @property
    def effects_committed(self) -> bool:
        return self._store.effects_committed

    async def record_of(self, job: str, attempt: int) -> ReportedRecord | None:
        key = (job, attempt)
        if key not in self._records:
            loaded = await self._store.load(job, attempt)
            if loaded is None:
                return None
            self._records[key] = loaded
        return self._records[key]

    async def next_transition(
        self,
        *,
        job: str,
        attempt: int,
        train_job: str | None,
        status: DerivedStatus,
        now: datetime,
    ) -> Transition | None:
        """The transition from the last reported record to ``status``; None when nothing is new."""
        previous = await self.record_of(job, attempt)
        events, record = advance(
            job=job,
            attempt=attempt,
            train_job=train_job,
            record=previous,
            status=status,
            now=now,
        )
        if not events:
            if record != previous:  # a record adopted without an event needs no write
                self._records[(job, attempt)] = record
            return None
        return Transition(job, attempt, events, record)

    async def commit(self, transition: Transition) -> None:
        await self._store.commit(
            transition.job, transition.attempt, transition.record, transition.events
        )
        self._records[(transition.job, transition.attempt)] = transition.record

    async def report(
        self,
        *,
        job: str,
        attempt: int,
        train_job: str | None,
        status: DerivedStatus,
        now: datetime,
    ) -> list[DispatchEvent]:
        """Compute and commit at once: the events of the transition, once the store holds it."""
        transition = await self.next_transition(
            job=job, attempt=attempt, train_job=train_job, status=status, now=now
        )
        if transition is None:
            return []
        await self.commit(transition)
        return transition.events

    def forget(self, job: str, attempt: int) -> None:
        self._records.pop((job, attempt), None)

    def held(self) -> int:
        """How many records are kept in memory."""
        return len(self._records)
