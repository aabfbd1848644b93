"""dispatch-kubeflow: dispatch jobs as Kubeflow Trainer v2 TrainJobs, supervised.

The package is layered; a module imports only from its own layer or lower ones (the contracts
in pyproject.toml, checked by ``lint-imports``):

- programs: ``cli``; ``handlers`` (the kopf operator) and ``admission`` (dispatch-admission);
  ``metrics`` (the Prometheus metrics both export, and their endpoint) and ``summary`` (the
  ``status`` command's tables);
- library: ``adapter`` (the facade); ``probe``, ``gate``, ``starting``, ``stopping``,
  ``finding`` (one operation each); ``supervisor`` (the watch); ``derivation``, ``index``,
  ``heartbeat``, ``reporting``, ``runtimes``; ``reasons``, ``events``, ``trainjob``, ``scope``;
- settings: ``schema``, ``settings``;
- foundation: ``kube`` (informer, API errors, object readers, Workload predicates, Leases and
  leader election, connections);
- base: ``clock``, ``gotime``, ``constants``, ``errors``, ``tasks``.

``publish`` stands alone: it runs in trainer images and imports nothing of the package.
"""

from dispatch_kubeflow.errors import (
    DispatchError,
    ErrInvalid,
    ErrNotFound,
    ErrOutcomeUnknown,
    ErrUnsupported,
)

__all__ = [
    "DispatchError",
    "ErrInvalid",
    "ErrNotFound",
    "ErrOutcomeUnknown",
    "ErrUnsupported",
]
