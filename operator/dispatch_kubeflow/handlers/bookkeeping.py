"""kopf's bookkeeping for this operator: written to a DispatchJob only where it must be.

kopf compares each event's object with the last spec it handled (its diff-base), which it keeps
by default in an annotation: once a DispatchJob's creation is handled, kopf patches the job to
write it, and its progress storage adds its marker of the annotations' prefix, a second write of
every new job besides its stop finalizer. A DispatchJob's status tells most of it already:
``status.attempt`` is the attempt the operator started (or refused), and spec fields other than
``attempt``, ``readmit`` and ``reject`` cannot change (its CRD's rules).

So a DispatchJob without kopf's annotation has, as its diff-base, its spec as it is with the
attempt it handled: the one its status records, or a later one this process handed over whose
start its status does not show yet (kept in memory until it does). A job that never started has
none, and kopf handles its creation, at once or, after a restart, again: a start is idempotent.
A raised ``spec.attempt`` differs from the handled one and is an update, as with the annotation.

``spec.readmit`` and ``spec.reject`` leave nothing in the status that tells which value was
handled: a job once handled with either set gets kopf's annotation, and a job that carries it
(those too that an earlier version of the operator made) goes on using it as kopf does. kopf's
marker (``<prefix>/kopf-managed``) is written with the progress or diff-base it marks, never
alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

import kopf

from dispatch_kubeflow.constants import DISPATCH_JOB_KIND, GROUP, STATUS_REPORTED

DIFFBASE_KEY: Final = "last-handled-configuration"
MARKER: Final = "kopf-managed"
LEAN_METADATA: Final = ("labels", "annotations")
# The spec fields whose handled value only the annotation keeps.
GATE_FIELDS: Final = ("readmit", "reject")
# Attempts handed over whose start no status shows yet; beyond this many the oldest is forgotten
# (kopf would then hand its start over again, which is idempotent).
HANDED_OVER_KEPT: Final = 100_000


def _outside_lean(field: Any) -> bool:
    """A handler's field (``spec.attempt``) the lean body does not carry: status, most metadata."""
    path = tuple(field.split(".")) if isinstance(field, str) else tuple(field or ())
    if not path:
        return True
    if path[0] == "status":
        return True
    return path[0] == "metadata" and (len(path) < 2 or path[1] not in LEAN_METADATA)


class SpecDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base, built without first deep-copying what it then drops.

    kopf builds the essence it compares on every watch event by deep-copying the whole body and
    then deleting the status and the metadata. A DispatchJob's status and managedFields are
    most of it and change with every transition, so the copy is made of the rest only; the
    essence is the same (the spec and whatever else sits at the top, the labels and
    annotations).
    """

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        fields = list(extra_fields or ())
        if any(_outside_lean(field) for field in fields):
            return super().build(body=body, extra_fields=fields)
        metadata = body.get("metadata") or {}
        lean: dict[str, Any] = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        lean["metadata"] = {k: metadata[k] for k in LEAN_METADATA if k in metadata}
        return super().build(body=kopf.Body(cast(kopf.RawBody, lean)), extra_fields=fields)


class ProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's progress annotations, whose marker is dropped when no progress is left to mark."""

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().purge(key=key, body=body, patch=patch)
        marker = f"{self.prefix}/{MARKER}"
        if marker in body.metadata.annotations or marker not in patch.metadata.annotations:
            return
        ours = f"{self.prefix}/"
        if not any(k.startswith(ours) and k != marker for k in patch.metadata.annotations):
            _drop_annotation(patch, marker)


def _drop_annotation(patch: kopf.Patch, key: str) -> None:
    """Take ``key`` out of the patch's annotations, and the stanzas it leaves empty."""
    metadata = patch["metadata"]
    del metadata["annotations"][key]
    if not metadata["annotations"]:
        del metadata["annotations"]
    if not metadata:
        del patch["metadata"]


def is_dispatch_job(body: Mapping[str, Any]) -> bool:
    return body.get("kind") == DISPATCH_JOB_KIND and str(body.get("apiVersion", "")).startswith(
        f"{GROUP}/"
    )


def _attempt(value: Any) -> int | None:
    return value if type(value) is int else None


def recorded_attempt(body: Mapping[str, Any]) -> int | None:
    """The attempt a DispatchJob's status shows handled; None if it shows none started."""
    status = body.get("status")
    if not isinstance(status, Mapping):
        return None
    recorded = _attempt(status.get("attempt"))
    if recorded is None and status.get(STATUS_REPORTED):
        spec = body.get("spec")
        return (_attempt(spec.get("attempt")) or 1) if isinstance(spec, Mapping) else 1
    return recorded


class DispatchJobDiffBase(SpecDiffBaseStorage):
    """The diff-base of the module docstring; other kinds keep kopf's annotation."""

    def __init__(self, *, kept: int = HANDED_OVER_KEPT, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kept = kept
        self._handed_over: dict[str, int] = {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if not is_dispatch_job(body) or self._annotated(body):
            return super().fetch(body=body)
        handled = self._handled_attempt(body)
        if handled is None:
            return None
        return self._derived(body, handled)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        spec = cast(Mapping[str, Any], essence).get("spec") or {}
        if (
            not is_dispatch_job(body)
            or self._annotated(body)
            or any(spec.get(field) is not None for field in GATE_FIELDS)
        ):
            super().store(body=body, patch=patch, essence=essence)
            return
        uid = str(body.metadata.uid)
        self._handed_over.pop(uid, None)
        self._handed_over[uid] = _attempt(spec.get("attempt")) or 1
        while len(self._handed_over) > self.kept:
            del self._handed_over[next(iter(self._handed_over))]

    def __len__(self) -> int:
        """Attempts handed over whose start no status shows yet."""
        return len(self._handed_over)

    def _annotated(self, body: kopf.Body) -> bool:
        annotations = body.metadata.annotations
        return any(key in annotations for key in self.make_keys(self.key, body=body))

    def _handled_attempt(self, body: kopf.Body) -> int | None:
        recorded = recorded_attempt(body)
        uid = str(body.metadata.uid)
        handed = self._handed_over.get(uid)
        if handed is None:
            return recorded
        if (recorded is not None and recorded >= handed) or body.metadata.deletion_timestamp:
            del self._handed_over[uid]
        return handed if recorded is None else max(handed, recorded)

    def _derived(self, body: kopf.Body, attempt: int) -> kopf.BodyEssence:
        essence = cast(dict[str, Any], self.build(body=body))
        spec = essence.setdefault("spec", {})
        for field in GATE_FIELDS:
            spec.pop(field, None)
        if (_attempt(spec.get("attempt")) or 1) != attempt:
            spec["attempt"] = attempt
        self.remove_empty_stanzas(cast(kopf.BodyEssence, essence))
        return cast(kopf.BodyEssence, essence)
