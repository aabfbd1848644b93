"""What the supervisor keeps of the watched objects, by (job, attempt).

The informers deliver objects one kind at a time; derivation needs them one job at a time. The
index routes each change to the jobs it may affect (a TrainJob, JobSet or pod by our labels, a
Workload by the TrainJob that owns it, a node by the pods bound to it) and builds a job's
``JobObservation`` from what it holds. Objects are trimmed to the fields derivation and
indexing read before they are kept, so 10,000 pods stay small in memory.

``node_taints`` and ``loss_taints_of`` are also what ``find`` uses, so a read-back and the watch
judge a node the same way.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatch_kubeflow.constants import (
    BUILTIN_LOSS_TAINTS,
    EFFECT_NO_EXECUTE,
    KIND_JOBSET,
    KIND_LEASE,
    KIND_NODE,
    KIND_POD,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PROBE,
)
from dispatch_kubeflow.events import JobObservation, Taint
from dispatch_kubeflow.kube.informer import Change
from dispatch_kubeflow.kube.objects import (
    dig,
    is_deleting,
    labels_of,
    mappings,
    name_of,
    text,
    uid_of,
)
from dispatch_kubeflow.kube.workloads import owner_trainjob_uids
from dispatch_kubeflow.settings import Settings

JobKey = tuple[str, int]
Obj = dict[str, Any]

# Pods already deleted are kept as evidence (how a rank ended); a job whose gang restarts many
# times keeps the newest of them, so the evidence of one job is bounded.
DELETED_PODS_KEPT = 32
# Jobs forgotten lately, whose going objects' late changes are ignored rather than starting a
# new record (the oldest are dropped first: late changes come within seconds).
FORGOTTEN_KEPT = 4096


# --------------------------------------------------------------------------------------------
# Trimming


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: obj[key] for key in keys if key in obj}


def _trim_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(
        obj.get("metadata") or {},
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "labels",
        "annotations",
        "ownerReferences",
        "deletionTimestamp",
    )


def trim(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object of ``kind`` that derivation and indexing read."""
    meta = _trim_metadata(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if kind == KIND_NODE:
        taints = [t for t in spec.get("taints") or [] if t.get("effect") == EFFECT_NO_EXECUTE]
        return {"metadata": _pick(meta, "name", "resourceVersion"), "spec": {"taints": taints}}
    if kind == KIND_POD:
        return {
            # creationTimestamp: which admission a pod belongs to (derivation.admission_pods).
            "metadata": _pick(
                meta,
                "name",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "labels",
                "deletionTimestamp",
            ),
            "spec": _pick(spec, "nodeName"),
            "status": _pick(
                status,
                "phase",
                "reason",
                "message",
                "conditions",
                "containerStatuses",
                "initContainerStatuses",
            ),
        }
    if kind == KIND_LEASE:
        return {"metadata": meta, "spec": dict(spec)}
    if kind in (KIND_TRAINJOB, KIND_WORKLOAD):
        return {"metadata": meta, "spec": _pick(spec, "suspend", "active"), "status": status}
    return {"metadata": meta, "status": status}


def trimmer(kind: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """``trim`` for one kind, as an informer takes it."""

    def trim_one(obj: Mapping[str, Any]) -> dict[str, Any]:
        return trim(kind, obj)

    return trim_one


# --------------------------------------------------------------------------------------------
# Reading jobs and nodes


def marked_deleted(pod: Obj) -> Obj:
    """A deleted pod, kept as evidence (a taint-manager deletion says NodeLost); marked
    deleted, it is never counted as running."""
    if is_deleting(pod):
        return pod
    return {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "deleted"}}


def pods_as_read(seen: Iterable[Obj], read: Mapping[str, Obj | None]) -> tuple[Obj, ...]:
    """A job's pods as the watch saw them, updated by a fresh read from the apiserver.

    ``read`` maps a pod's name to the pod as read now, or to None when it no longer exists: a
    read pod replaces the watched one (it is newer), a pod gone since is kept marked deleted
    (it is evidence), and a pod the read found that the watch has not shown is added. Pods not
    read are kept as watched.
    """
    pods = {name_of(pod): pod for pod in seen}
    for name, pod in read.items():
        if pod is not None:
            pods[name] = pod
        elif name in pods:
            pods[name] = marked_deleted(pods[name])
    return tuple(pods.values())


def job_key(obj: Mapping[str, Any]) -> JobKey | None:
    """The (job, attempt) our labels put an object in, if it has both labels.

    The preflight probe's objects carry them too, but belong to no job.
    """
    labels = labels_of(obj)
    job, attempt = labels.get(LABEL_JOB), labels.get(LABEL_ATTEMPT)
    if not job or attempt is None or LABEL_PROBE in labels:
        return None
    try:
        return str(job), int(attempt)
    except ValueError:
        return None


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A node's NoExecute taints: the only ones that evict pods, so the only ones that lose one."""
    return tuple(
        Taint(
            key=str(t.get("key") or ""),
            value=t.get("value"),
            effect=str(t.get("effect")),
            time_added=text(t.get("timeAdded")) or None,
        )
        for t in mappings(dig(node, "spec", "taints"))
        if t.get("effect") == EFFECT_NO_EXECUTE
    )


def loss_taints_of(settings: Settings) -> frozenset[str]:
    """The taint keys that mean a node is lost: Kubernetes' own and the adapter's."""
    return frozenset(BUILTIN_LOSS_TAINTS) | frozenset(settings.node_loss_taints)


def node_of(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is bound to, if it is bound."""
    node = dig(pod, "spec", "nodeName")
    return node if isinstance(node, str) and node else None


# --------------------------------------------------------------------------------------------
# The index


@dataclass
class JobIndex:
    """Every watched object, by the (job, attempt) it belongs to."""

    train_jobs: dict[JobKey, Obj] = field(default_factory=dict)
    train_job_keys_by_uid: dict[str, JobKey] = field(default_factory=dict)
    job_sets: dict[JobKey, Obj] = field(default_factory=dict)
    pods: defaultdict[JobKey, dict[str, Obj]] = field(default_factory=lambda: defaultdict(dict))
    pod_keys: dict[str, JobKey] = field(default_factory=dict)
    workloads_by_owner: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, tuple[Taint, ...]] = field(default_factory=dict)
    keys_by_node: defaultdict[str, set[JobKey]] = field(default_factory=lambda: defaultdict(set))
    # Deleted nodes that pods of a job are bound to (NodeLost for those jobs).
    deleted_nodes: set[str] = field(default_factory=set)
    forgotten: OrderedDict[JobKey, None] = field(default_factory=OrderedDict)

    def job_keys(self) -> set[JobKey]:
        return set(self.train_jobs) | set(self.job_sets) | {k for k, v in self.pods.items() if v}

    def apply(self, change: Change) -> set[JobKey]:
        """Record a change; return the jobs it may affect."""
        handler = {
            KIND_TRAINJOB: self._train_job,
            KIND_JOBSET: self._job_set,
            KIND_POD: self._pod,
            KIND_WORKLOAD: self._workload,
            KIND_NODE: self._node,
        }.get(change.kind)
        return handler(change) if handler else set()

    def _after_forgetting(self, key: JobKey, change: Change) -> bool:
        """False for a change of a forgotten job's object that is going: nothing to learn.

        Anything else of that (job, attempt) is a new job under the same name.
        """
        if key not in self.forgotten:
            return True
        if change.type == "DELETED" or is_deleting(change.obj):
            return False
        del self.forgotten[key]
        return True

    def _train_job(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None or not self._after_forgetting(key, change):
            return set()
        uid = uid_of(change.obj)
        if change.type == "DELETED":
            self.train_jobs.pop(key, None)
            self.train_job_keys_by_uid.pop(uid, None)
        else:
            self.train_jobs[key] = change.obj
            if uid:
                self.train_job_keys_by_uid[uid] = key
        return {key}

    def _job_set(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None or not self._after_forgetting(key, change):
            return set()
        if change.type == "DELETED":
            self.job_sets.pop(key, None)
        else:
            self.job_sets[key] = change.obj
        return {key}

    def _pod(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None or not self._after_forgetting(key, change):
            return set()
        name = name_of(change.obj)
        pod = change.obj
        pods = self.pods[key]
        if change.type == "DELETED":
            pod = marked_deleted(pod)
            pods.pop(name, None)  # to the end: the newest deleted pods are the ones kept
        pods[name] = pod
        self.pod_keys[name] = key
        if change.type == "DELETED":
            self._drop_oldest_deleted(pods)
        node = node_of(pod)
        if node:
            self.keys_by_node[node].add(key)
        return {key}

    def _drop_oldest_deleted(self, pods: dict[str, Obj]) -> None:
        deleted = [name for name, pod in pods.items() if is_deleting(pod)]
        for name in deleted[: max(0, len(deleted) - DELETED_PODS_KEPT)]:
            del pods[name]
            self.pod_keys.pop(name, None)

    def _workload(self, change: Change) -> set[JobKey]:
        affected: set[JobKey] = set()
        for uid in owner_trainjob_uids(change.obj):
            if change.type == "DELETED":
                self.workloads_by_owner.pop(uid, None)
            else:
                self.workloads_by_owner[uid] = change.obj
            key = self.train_job_keys_by_uid.get(uid)
            if key is not None:
                affected.add(key)
        return affected

    def _node(self, change: Change) -> set[JobKey]:
        name = name_of(change.obj)
        deleted = change.type == "DELETED"
        taints = () if deleted else node_taints(change.obj)
        was_deleted = name in self.deleted_nodes
        if deleted and self.keys_by_node.get(name):
            self.deleted_nodes.add(name)
        elif not deleted:
            self.deleted_nodes.discard(name)
        if self.nodes.get(name, ()) == taints and was_deleted == (name in self.deleted_nodes):
            return set()
        if taints:
            self.nodes[name] = taints
        else:
            self.nodes.pop(name, None)
        return set(self.keys_by_node.get(name, ()))

    def observation(self, key: JobKey, stopped: bool) -> JobObservation:
        train_job = self.train_jobs.get(key)
        uid = uid_of(train_job) if train_job else ""
        pods = tuple(self.pods.get(key, {}).values())
        nodes = {node_of(p) for p in pods}
        # Built without validation: the objects came from the API and copying them per
        # derivation would dominate the cost of a busy watch.
        return JobObservation.model_construct(
            job=key[0],
            attempt=key[1],
            train_job=train_job,
            job_set=self.job_sets.get(key),
            pods=pods,
            workload=self.workloads_by_owner.get(uid) if uid else None,
            node_taints={n: self.nodes[n] for n in nodes if n and n in self.nodes},
            deleted_nodes=frozenset(n for n in nodes if n and n in self.deleted_nodes),
            stopped=stopped,
        )

    def all_gone(self, key: JobKey) -> bool:
        """Nothing of the job is left but pods already deleted (kept as evidence)."""
        if key in self.train_jobs or key in self.job_sets:
            return False
        return all(is_deleting(p) for p in self.pods.get(key, {}).values())

    def forget(self, key: JobKey) -> None:
        """Drop a finished job whose objects are all gone; its late changes are ignored."""
        for pod_name in self.pods.pop(key, {}):
            self.pod_keys.pop(pod_name, None)
        for node in [n for n, keys in self.keys_by_node.items() if key in keys]:
            self.keys_by_node[node].discard(key)
            if not self.keys_by_node[node]:
                del self.keys_by_node[node]
        self.deleted_nodes = {n for n in self.deleted_nodes if self.keys_by_node.get(n)}
        self.forgotten[key] = None
        while len(self.forgotten) > FORGOTTEN_KEPT:
            self.forgotten.popitem(last=False)

    def is_forgotten(self, key: JobKey) -> bool:
        return key in self.forgotten

    def held(self) -> dict[str, int]:
        """How many entries each structure holds (the forgotten keys are bounded apart)."""
        return {
            "trainJobs": len(self.train_jobs),
            "trainJobUids": len(self.train_job_keys_by_uid),
            "jobSets": len(self.job_sets),
            "pods": sum(len(pods) for pods in self.pods.values()),
            "podKeys": len(self.pod_keys),
            "workloads": len(self.workloads_by_owner),
            "nodesWithJobs": len(self.keys_by_node),
        }
