"""KubeflowAdapter: its spec parsed, its adapter opened and watched for as long as it exists.

One kopf daemon per KubeflowAdapter runs *sessions*: a session parses the spec of one generation,
opens the adapter (connect + preflight probe), publishes it for the DispatchJob handlers, and
consumes its single ``watch()`` stream, routing each dispatch event to the DispatchJob it names.
A spec change ends the session cleanly (the adapter is closed) and the next one starts from the new
spec; deleting the resource stops the daemon. Every step is reflected in the status conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, cast

import kopf
from kubernetes_asyncio.client import ApiClient

from dispatch_kubeflow import metrics
from dispatch_kubeflow.adapter import Adapter, AdapterConfig
from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    GROUP,
    KUBEFLOW_ADAPTERS,
    REASON_INVALID_SETTINGS,
    VERSION,
    AdapterCondition,
    EventType,
)
from dispatch_kubeflow.errors import (
    DispatchError,
    ErrInvalid,
    ErrUnsupported,
    ForbiddenError,
    ProbeError,
)
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.gotime import format_duration
from dispatch_kubeflow.handlers.conditions import (
    Condition,
    is_reason,
    parse_conditions,
    set_conditions,
)
from dispatch_kubeflow.handlers.kube import update_status
from dispatch_kubeflow.handlers.registry import AdapterRegistry, EventLines
from dispatch_kubeflow.handlers.reported import DispatchJobStatusStore
from dispatch_kubeflow.settings import Settings, parse_settings_object
from dispatch_kubeflow.tasks import cancel_and_wait, stop_if_cancelled

# How the probe's failures read while it raised ErrUnsupported rather than ProbeError.
PREFLIGHT_PREFIX: Final = "preflight probe: "
RETRY_FIRST: Final = 5.0
RETRY_MAX: Final = 300.0
CANCELLATION_TIMEOUT: Final = 30.0
# How often a serving session looks at whether every watched kind can be listed.
WATCH_HEALTH_PERIOD: Final = timedelta(seconds=5)

Logger = logging.Logger | logging.LoggerAdapter[Any]
Opener = Callable[[AdapterConfig], Awaitable[Adapter]]


def _condition(
    kind: str, status: str, reason: str, message: str, generation: int | None
) -> Condition:
    return Condition.model_validate(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
        }
    )


@dataclass
class AdapterStatus:
    """The status of a KubeflowAdapter being built up by one session."""

    generation: int | None
    updates: list[Condition] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    drop: set[str] = field(default_factory=set)

    def condition(self, kind: str, status: str, reason: str, message: str = "") -> AdapterStatus:
        self.updates.append(_condition(kind, status, reason, message, self.generation))
        return self

    def patch(self, current: Mapping[str, Any] | None, now: datetime) -> dict[str, Any]:
        existing = [
            c
            for c in parse_conditions((current or {}).get("conditions"))
            if c.type not in self.drop
        ]
        conditions = set_conditions(existing, self.updates, now=now)
        return {
            **self.fields,
            "observedGeneration": self.generation,
            "conditions": [c.to_wire() for c in conditions],
        }


def parse_spec(spec: Mapping[str, Any]) -> Settings:
    """The settings in a KubeflowAdapter's spec; ``ErrInvalid`` names the JSON pointer."""
    return parse_settings_object(dict(spec), pointer="/spec")


def invalid_status(error: ErrInvalid, generation: int | None) -> AdapterStatus:
    status = AdapterStatus(generation)
    status.condition(AdapterCondition.VALID, "False", REASON_INVALID_SETTINGS, str(error))
    for kind in (AdapterCondition.CONNECTED, AdapterCondition.PROBED):
        status.condition(kind, "Unknown", "InvalidSettings", "the spec is not valid")
    status.condition(AdapterCondition.READY, "False", REASON_INVALID_SETTINGS, str(error))
    status.drop.add(AdapterCondition.ADMISSION_HEALTHY)
    return status


def _declared(settings: Settings) -> dict[str, Any]:
    declarations = settings.declarations()
    return {
        "mode": "kueue" if settings.kueue_mode else "plain",
        "readmissionGate": settings.readmission_gate,
        "declarations": {
            "nodeLossWindow": format_duration(declarations.node_loss_window),
            "callBound": format_duration(declarations.call_bound),
            "polledLoss": list(declarations.polled_loss),
        },
    }


def opening_status(settings: Settings, generation: int | None) -> AdapterStatus:
    status = AdapterStatus(generation, fields=_declared(settings))
    status.condition(
        AdapterCondition.VALID, "True", "Parsed", "the spec is a valid settings object"
    )
    status.condition(AdapterCondition.CONNECTED, "Unknown", "Connecting", "opening the adapter")
    status.condition(AdapterCondition.PROBED, "Unknown", "Probing", "preflight probe pending")
    status.condition(AdapterCondition.READY, "False", "Opening", "opening the adapter")
    if settings.kueue_mode:
        status.condition(
            AdapterCondition.ADMISSION_HEALTHY, "Unknown", "AwaitingHeartbeat", "no heartbeat yet"
        )
    else:
        status.drop.add(AdapterCondition.ADMISSION_HEALTHY)
    return status


def is_probe_failure(error: Exception) -> bool:
    """The adapter connected, and its preflight probe found the Trainer API unusable."""
    if isinstance(error, ProbeError):
        return True
    return isinstance(error, ErrUnsupported) and str(error).startswith(PREFLIGHT_PREFIX)


def forbidden_in(error: BaseException | None) -> ForbiddenError | None:
    """The 403 behind ``error`` (itself, or what it was raised from), if there is one."""
    while error is not None:
        if isinstance(error, ForbiddenError):
            return error
        error = error.__cause__
    return None


def forbidden_reason(error: ForbiddenError) -> str:
    """A condition reason naming the refused verb and resource: ``ForbiddenListNodes``."""
    words = [error.verb, *re.split(r"[^A-Za-z0-9]+", error.resource)]
    return "Forbidden" + "".join(word.capitalize() for word in words if word)


def open_failed_status(error: Exception, generation: int | None) -> AdapterStatus:
    message = str(error) or type(error).__name__
    status = AdapterStatus(generation)
    forbidden = forbidden_in(error)
    if is_probe_failure(error):
        reason = forbidden_reason(forbidden) if forbidden else "ProbeFailed"
        status.condition(AdapterCondition.CONNECTED, "True", "Connected", "the apiserver answered")
        status.condition(AdapterCondition.PROBED, "False", reason, message)
        status.condition(AdapterCondition.READY, "False", reason, message)
    else:
        reason = "Unsupported" if isinstance(error, ErrUnsupported) else "ConnectionFailed"
        if forbidden:
            reason = forbidden_reason(forbidden)
        status.condition(AdapterCondition.CONNECTED, "False", reason, message)
        status.condition(AdapterCondition.PROBED, "Unknown", reason, "not probed")
        status.condition(AdapterCondition.READY, "False", reason, message)
    return status


def watch_blocked_status(
    problems: Sequence[DispatchError], generation: int | None
) -> AdapterStatus:
    """Ready=False while a watched kind cannot be listed: no event is derived until it can."""
    forbidden = forbidden_in(problems[0])
    reason = forbidden_reason(forbidden) if forbidden else "CannotList"
    message = "; ".join(str(p) for p in problems) + " (no events until every kind is listed)"
    status = AdapterStatus(generation)
    status.condition(AdapterCondition.READY, "False", reason, message)
    return status


def ready_status(generation: int | None) -> AdapterStatus:
    status = AdapterStatus(generation)
    status.condition(AdapterCondition.CONNECTED, "True", "Connected", "the apiserver answered")
    status.condition(AdapterCondition.PROBED, "True", "ProbePassed", "preflight probe passed")
    status.condition(AdapterCondition.READY, "True", "Watching", "watching the served namespace")
    return status


def watch_failed_status(error: Exception, generation: int | None) -> AdapterStatus:
    message = f"watch ended: {error or type(error).__name__}"
    status = AdapterStatus(generation)
    status.condition(AdapterCondition.READY, "False", "WatchFailed", message)
    return status


def heartbeat_status(event: DispatchEvent, generation: int | None) -> AdapterStatus:
    healthy = event.gate == "open"
    reason = event.reason if is_reason(event.reason) else ("GateOpen" if healthy else "GateClosed")
    message = event.message or f"admission gate {event.gate}"
    status = AdapterStatus(generation)
    status.condition(AdapterCondition.ADMISSION_HEALTHY, str(healthy), reason, message)
    return status


@dataclass
class AdapterSession:
    """One generation of one KubeflowAdapter: parse, open, watch, until told to stop."""

    api: ApiClient
    name: str
    namespace: str
    generation: int | None
    spec: Mapping[str, Any]
    registry: AdapterRegistry
    event_lines: EventLines
    post_event: Callable[[Mapping[str, Any], str, str, str], None]
    logger: Logger
    opener: Opener = Adapter.open
    clock: Clock = SYSTEM_CLOCK

    async def write(self, status: AdapterStatus) -> None:
        async def change(current: dict[str, Any]) -> dict[str, Any]:
            patch = status.patch(current.get("status"), self.clock.now())
            metrics.adapter_conditions(self.namespace, self.name, patch["conditions"])
            return patch

        await update_status(self.api, KUBEFLOW_ADAPTERS, self.namespace, self.name, change)

    async def run(self, until: Sequence[asyncio.Event | kopf.DaemonStopped]) -> None:
        """Run this generation until one of ``until`` is set."""
        stop = asyncio.ensure_future(_first_of(until))
        work = asyncio.ensure_future(self._serve())
        try:
            await asyncio.wait({stop, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(stop, work)
        if not work.cancelled():
            work.result()  # the session's own failure, if it ended before being stopped

    def adapter_config(self, settings: Settings) -> AdapterConfig:
        """The adapter of this session, reporting into the DispatchJobs' status."""
        store = DispatchJobStatusStore(
            self.api,
            settings.namespace,
            self.name,
            settings.timeouts.request,
            post_event=self.post_event,
            clock=self.clock,
            default_runtime=settings.runtimes[0].name,
            gate=settings.readmission_gate == "yes",
        )
        return AdapterConfig(settings=settings, token=None, adapter_name=self.name, store=store)

    async def _serve(self) -> None:
        try:
            settings = parse_spec(self.spec)
        except ErrInvalid as error:
            self.logger.warning("invalid settings: %s", error)
            await self.write(invalid_status(error, self.generation))
            await asyncio.Event().wait()  # nothing to do until the spec changes
            return
        await self.write(opening_status(settings, self.generation))
        delay = RETRY_FIRST
        while True:
            config = self.adapter_config(settings)
            try:
                adapter = await self.opener(config)
            except asyncio.CancelledError:
                await _close(config.store)
                raise
            except Exception as error:  # every failure is shown, then retried
                await _close(config.store)
                stop_if_cancelled()
                self.logger.warning("opening the adapter failed: %s", error)
                await self.write(open_failed_status(error, self.generation))
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            delay = RETRY_FIRST
            try:
                await self._watch(adapter, settings)
            finally:
                await _close(config.store)
            await asyncio.sleep(delay)

    async def _watch(self, adapter: Adapter, settings: Settings) -> None:
        await self.registry.publish(settings.namespace, self.name, adapter)
        health = asyncio.ensure_future(self._watch_health(adapter))
        try:
            await self.write(ready_status(self.generation))
            async for event in adapter.watch():
                await self._route(event, settings.namespace)
            raise RuntimeError("the watch stream ended")
        except asyncio.CancelledError:
            raise
        except Exception as error:
            stop_if_cancelled()
            self.logger.warning("the adapter's watch failed: %s", error)
            await self.write(watch_failed_status(error, self.generation))
        finally:
            await cancel_and_wait(health)
            await self.registry.withdraw(settings.namespace, self.name, adapter)
            with contextlib.suppress(Exception):
                await adapter.close()

    async def _watch_health(self, adapter: Adapter) -> None:
        """Every ``WATCH_HEALTH_PERIOD``: Ready=False naming the kinds that cannot be listed,
        and Ready=True again once every kind can."""
        shown: list[str] = []
        while True:
            await self.clock.sleep_until(self.clock.now() + WATCH_HEALTH_PERIOD)
            problems = adapter.watch_problems()
            now_shown = [str(p) for p in problems]
            if now_shown == shown:
                continue
            if problems:
                await self.write(watch_blocked_status(problems, self.generation))
            else:
                await self.write(ready_status(self.generation))
            shown = now_shown

    async def _route(self, event: DispatchEvent, served: str) -> None:
        """Write the event's line; a heartbeat also moves the adapter's AdmissionHealthy.

        A job's event is already in its DispatchJob's status: the store committed it there.
        """
        wire = event.model_dump(mode="json", by_alias=True)
        self.event_lines.write({"adapter": self.name, "namespace": served, **wire})
        metrics.event_reported(served, self.name, wire)
        if event.type is EventType.ADMISSION_HEARTBEAT:
            await self.write(heartbeat_status(event, self.generation))


async def _close(store: object) -> None:
    """Stop what the session's report store watches, if it is one that watches."""
    if isinstance(store, DispatchJobStatusStore):
        await store.close()


async def _first_of(flags: Sequence[asyncio.Event | kopf.DaemonStopped]) -> None:
    waiters = [asyncio.ensure_future(flag.wait()) for flag in flags]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def post_kubernetes_event(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, dict(body)), type=kind, reason=reason, message=message)


def post_warning_event(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    if kind == "Warning":
        post_kubernetes_event(body, kind, reason, message)


def post_no_event(_body: Mapping[str, Any], _kind: str, _reason: str, _message: str) -> None:
    return None


POSTERS: Final = {
    "all": post_kubernetes_event,
    "warnings": post_warning_event,
    "none": post_no_event,
}


@kopf.daemon(GROUP, VERSION, KUBEFLOW_ADAPTERS, cancellation_timeout=CANCELLATION_TIMEOUT)
async def serve_adapter(
    body: kopf.Body,
    meta: kopf.Meta,
    name: str,
    namespace: str | None,
    memo: Any,
    stopped: kopf.DaemonStopped,
    logger: Logger,
    **_: Any,
) -> None:
    """Serve one KubeflowAdapter: a session per spec generation until the resource goes."""
    while not stopped:
        changed = asyncio.Event()
        memo.spec_changed = changed
        memo.serving_generation = meta.get("generation")
        session = AdapterSession(
            api=memo.api,
            name=name,
            namespace=str(namespace),
            generation=meta.get("generation"),
            spec=dict(body.get("spec") or {}),
            registry=memo.registry,
            event_lines=memo.event_lines,
            post_event=POSTERS[memo.get("job_events", "all")],
            logger=logger,
        )
        logger.info("serving generation %s", session.generation)
        await session.run(until=(changed, stopped))
    metrics.adapter_gone(str(namespace), name)


def generation_moved_on(body: kopf.Body, memo: Any, **_: Any) -> bool:
    """The resource's generation is not the one its running session serves."""
    serving = memo.get("serving_generation")
    generation = body.get("metadata", {}).get("generation")
    return serving is not None and generation != serving


# The filter keeps kopf from invoking (and logging) the handler for every status write.
@kopf.on.event(GROUP, VERSION, KUBEFLOW_ADAPTERS, when=generation_moved_on)
async def notice_spec_change(body: kopf.Body, memo: Any, **_: Any) -> None:
    """End the running session: its spec is no longer the resource's.

    Async on purpose: kopf runs sync handlers in a thread, and asyncio.Event is not thread-safe.
    """
    changed = memo.get("spec_changed")
    if changed is not None and generation_moved_on(body, memo):
        changed.set()
