"""The way back from a disruption: the readmission gate from a DispatchJob, and recovery.

With ``kueue.admissionCheck`` set, Kueue holds an evicted job's Workload at the gate, and the
DispatchJob says so (``Admitted=False``, reason ``HeldAtGate``). A kubectl user opens the gate by
raising ``spec.readmit`` (the same attempt runs again) or closes it by setting ``spec.reject``.
``spec.recovery`` lets the operator decide by itself: readmit after an eviction whose cause is in
``readmitOn`` (at most ``maxReadmissions`` times per attempt), raise ``spec.attempt`` after a
failure whose cause is in ``retryOn`` (up to ``maxAttempts``), each ``backoff`` after the event.
Every act is a Kubernetes Event and an entry of ``status.recovery``; a decision is keyed by the
id of the dispatch event it answers, and one already in ``status.recovery`` is not taken again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, field_validator
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock, format_time, parse_time
from dispatch_kubeflow.constants import (
    DISPATCH_JOBS,
    GROUP,
    JSON_PATCH,
    VERSION,
    Cause,
    EventType,
    State,
)
from dispatch_kubeflow.errors import ErrInvalid, ErrNotFound, ErrOutcomeUnknown, ErrUnsupported
from dispatch_kubeflow.gotime import parse_duration
from dispatch_kubeflow.handlers.crds import (
    RECOVERY_BACKOFF_DEFAULT,
    RECOVERY_MAX_ATTEMPTS_DEFAULT,
    RECOVERY_MAX_READMISSIONS_DEFAULT,
)
from dispatch_kubeflow.handlers.jobs import serving_adapter
from dispatch_kubeflow.handlers.kube import read_object, update_status
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, is_invalid, is_not_found
from dispatch_kubeflow.kube.objects import dig
from dispatch_kubeflow.tasks import stop_if_cancelled

log = logging.getLogger(__name__)

RECOVERY_KEPT: Final = 20
RETRY_UNKNOWN: Final = 10.0
# Failures after which a due decision is tried again later: the outcome is not known.
RETRIED: Final[tuple[type[BaseException], ...]] = (
    ErrOutcomeUnknown,
    kopf.TemporaryError,
    *REQUEST_ERRORS,
)

Action = Literal["Readmitted", "Retried", "Rejected", "Refused"]


class RecoveryPolicy(BaseModel):
    """``spec.recovery``, as the CRD has already validated it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    readmit_on: frozenset[Cause] = frozenset()
    retry_on: frozenset[Cause] = frozenset()
    max_attempts: int = RECOVERY_MAX_ATTEMPTS_DEFAULT
    max_readmissions: int = RECOVERY_MAX_READMISSIONS_DEFAULT
    backoff: timedelta = timedelta(seconds=parse_duration(RECOVERY_BACKOFF_DEFAULT).total_seconds())

    @field_validator("backoff", mode="before")
    @classmethod
    def _go_duration(cls, value: Any) -> Any:
        return (
            timedelta(seconds=parse_duration(value).total_seconds())
            if isinstance(value, str)
            else value
        )


@dataclass(frozen=True)
class Decision:
    """What the policy does about one dispatch event, and from when."""

    action: Action
    event: str
    attempt: int
    due: datetime
    message: str


def _entries(status: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    entries = (status or {}).get("recovery")
    return [e for e in entries if isinstance(e, Mapping)] if isinstance(entries, list) else []


def decide(spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> Decision | None:
    """The policy's decision on the current attempt's latest event; None when it has none."""
    raw = spec.get("recovery")
    if not isinstance(raw, Mapping):
        return None
    policy = RecoveryPolicy.model_validate(raw)
    attempt = int(spec.get("attempt") or 1)
    events = [
        e
        for e in (status or {}).get("events") or []
        if isinstance(e, Mapping) and e.get("attempt") == attempt
    ]
    if not events:
        return None
    last = events[-1]
    event_id, at = last.get("id"), parse_time(last.get("time"))
    done = _entries(status)
    if not isinstance(event_id, str) or at is None or any(e.get("event") == event_id for e in done):
        return None
    cause = last.get("cause")
    due = at + policy.backoff
    if last.get("type") == EventType.EVICTED and cause in policy.readmit_on:
        readmitted = sum(
            1 for e in done if e.get("action") == "Readmitted" and e.get("attempt") == attempt
        )
        if spec.get("reject") or readmitted >= policy.max_readmissions:
            return None
        message = (
            f"evicted ({cause}): readmission {readmitted + 1} of {policy.max_readmissions} "
            f"of attempt {attempt}"
        )
        return Decision("Readmitted", event_id, attempt, due, message)
    failed = last.get("type") == EventType.FINISHED and last.get("state") == State.FAILED
    if failed and cause in policy.retry_on and attempt < policy.max_attempts:
        message = (
            f"attempt {attempt} failed ({cause}): attempt {attempt + 1} of {policy.max_attempts}"
        )
        return Decision("Retried", event_id, attempt, due, message)
    return None


def recovery_entry(
    action: Action, *, event: str | None, attempt: int, now: datetime, message: str
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "action": action,
        "attempt": attempt,
        "time": format_time(now),
        "message": message,
    }
    if event is not None:
        entry["event"] = event
    return entry


def with_entry(
    entries: Sequence[Mapping[str, Any]], entry: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The recovery history with ``entry`` added: the last ``RECOVERY_KEPT``, oldest first."""
    return [*entries, entry][-RECOVERY_KEPT:]


async def record(
    api: client.ApiClient, namespace: str, name: str, entry: Mapping[str, Any]
) -> None:
    async def change(current: dict[str, Any]) -> dict[str, Any]:
        return {"recovery": with_entry(_entries(current.get("status")), entry)}

    await update_status(api, DISPATCH_JOBS, namespace, name, change)


# --- carrying out ---------------------------------------------------------------------------------


async def raise_attempt_from(
    api: client.ApiClient, namespace: str, name: str, uid: str, attempt: int
) -> bool:
    """Raise ``spec.attempt`` from ``attempt`` by one; False when it had already moved, or when
    the DispatchJob of ``uid`` was deleted and another created under its name."""
    patch: Callable[..., Awaitable[Any]] = client.CustomObjectsApi(
        api
    ).patch_namespaced_custom_object
    body = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/spec/attempt", "value": attempt},
        {"op": "replace", "path": "/spec/attempt", "value": attempt + 1},
    ]
    try:
        await patch(GROUP, VERSION, namespace, DISPATCH_JOBS, name, body, _content_type=JSON_PATCH)
    except ApiException as error:
        if is_invalid(error) or is_not_found(error):  # the test failed: someone moved it first
            return False
        raise
    return True


async def act(memo: kopf.Memo, body: Mapping[str, Any], decision: Decision) -> bool:
    """Carry ``decision`` out; False when it no longer applies. Refusals raise."""
    namespace, name = str(dig(body, "metadata", "namespace")), str(dig(body, "metadata", "name"))
    if decision.action == "Retried":
        uid = str(dig(body, "metadata", "uid"))
        return await raise_attempt_from(memo.api, namespace, name, uid, decision.attempt)
    adapter = await serving_adapter(memo.registry, namespace, str(dig(body, "spec", "adapter")))
    await adapter.readmit(name)
    return True


async def carry_out(memo: kopf.Memo, namespace: str, name: str, event: str, clock: Clock) -> None:
    """Once due: read the DispatchJob afresh, decide again, act, and record what was done."""
    body = await _read(memo.api, namespace, name)
    if body is None or dig(body, "metadata", "deletionTimestamp"):
        return
    decision = decide(body.get("spec") or {}, body.get("status"))
    if decision is None or decision.event != event:
        return
    try:
        acted = await act(memo, body, decision)
    except (ErrInvalid, ErrUnsupported, ErrNotFound) as error:
        message = f"{decision.action.lower()} refused: {error}"
        kopf.warn(cast(kopf.Body, dict(body)), reason="RecoveryRefused", message=message)
        entry = recovery_entry(
            "Refused", event=event, attempt=decision.attempt, now=clock.now(), message=message
        )
        await record(memo.api, namespace, name, entry)
        return
    if not acted:
        return
    kopf.info(
        cast(kopf.Body, dict(body)), reason=decision.action, message=f"recovery: {decision.message}"
    )
    entry = recovery_entry(
        decision.action,
        event=event,
        attempt=decision.attempt,
        now=clock.now(),
        message=decision.message,
    )
    await record(memo.api, namespace, name, entry)


async def _read(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    return await read_object(api, DISPATCH_JOBS, namespace, name)


# --- scheduling -----------------------------------------------------------------------------------


def _scheduled(memo: kopf.Memo) -> dict[tuple[str, str], asyncio.Task[None]]:
    if "recovery_scheduled" not in memo:
        memo.recovery_scheduled = {}
    scheduled: dict[tuple[str, str], asyncio.Task[None]] = memo.recovery_scheduled
    return scheduled


async def _when_due(
    memo: kopf.Memo, namespace: str, name: str, decision: Decision, clock: Clock
) -> None:
    delay = RETRY_UNKNOWN
    while True:
        await clock.sleep_until(decision.due)
        try:
            await carry_out(memo, namespace, name, decision.event, clock)
            return
        except RETRIED as error:
            stop_if_cancelled()
            log.warning("recovery of %s/%s: %s; trying again", namespace, name, error)
            decision = Decision(
                decision.action,
                decision.event,
                decision.attempt,
                clock.now() + timedelta(seconds=delay),
                decision.message,
            )
            delay = min(delay * 2, 300.0)


def schedule(
    memo: kopf.Memo, body: Mapping[str, Any], *, clock: Clock = SYSTEM_CLOCK
) -> Decision | None:
    """Schedule the policy's decision on ``body``, once per (DispatchJob, event)."""
    if dig(body, "metadata", "deletionTimestamp"):
        return None
    decision = decide(body.get("spec") or {}, body.get("status"))
    if decision is None:
        return None
    key = (str(dig(body, "metadata", "uid")), decision.event)
    scheduled = _scheduled(memo)
    if key in scheduled:
        return decision
    namespace, name = str(dig(body, "metadata", "namespace")), str(dig(body, "metadata", "name"))
    task = asyncio.create_task(_when_due(memo, namespace, name, decision, clock))
    scheduled[key] = task
    task.add_done_callback(lambda _: scheduled.pop(key, None))
    return decision


def has_recovery_policy(spec: kopf.Spec, **_: Any) -> bool:
    """Only a DispatchJob with ``spec.recovery`` has decisions to follow."""
    return isinstance(spec.get("recovery"), Mapping)


# The filter keeps kopf from invoking the handler for every status write of every DispatchJob.
@kopf.on.event(GROUP, VERSION, DISPATCH_JOBS, when=has_recovery_policy)
async def follow_recovery(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Every change of a DispatchJob (and each one listed at start): is a decision due?"""
    if type == "DELETED":
        return
    schedule(memo, body)


# --- the gate, by hand ----------------------------------------------------------------------------


async def gate_request(
    memo: kopf.Memo,
    body: kopf.Body,
    action: Literal["Readmitted", "Rejected"],
    call: Callable[[Any], Awaitable[None]],
    message: str,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
    adapter = await serving_adapter(memo.registry, namespace, str(dig(body, "spec", "adapter")))
    try:
        await call(adapter)
    except ErrOutcomeUnknown as error:
        raise kopf.TemporaryError(str(error), delay=RETRY_UNKNOWN) from error
    except (ErrInvalid, ErrUnsupported, ErrNotFound) as error:
        kopf.warn(body, reason=f"{action[:-2]}Refused", message=str(error))
        return
    kopf.info(body, reason=action, message=message)
    attempt = int(dig(body, "spec", "attempt") or 1)
    entry = recovery_entry(action, event=None, attempt=attempt, now=clock.now(), message=message)
    await record(memo.api, namespace, name, entry)


@kopf.on.update(GROUP, VERSION, DISPATCH_JOBS, field="spec.readmit")
async def readmit_job(
    old: Any, new: Any, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """``spec.readmit`` raised: open the readmission gate for the current attempt."""
    if new is None or (old is not None and int(new) <= int(old)):
        return

    async def readmit(adapter: Any) -> None:
        await adapter.readmit(name)

    await gate_request(memo, body, "Readmitted", readmit, f"spec.readmit raised to {new}")


@kopf.on.update(GROUP, VERSION, DISPATCH_JOBS, field="spec.reject")
async def reject_job(
    old: Any, new: Any, body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """``spec.reject`` set: turn the current attempt away at the readmission gate."""
    if not new or old:
        return

    async def reject(adapter: Any) -> None:
        await adapter.reject(name, str(new))

    await gate_request(memo, body, "Rejected", reject, f"spec.reject: {new}")
