"""dispatch-kubeflow: dispatch jobs as Kubeflow Trainer v2 TrainJobs, supervised.

The package is layered in the direction data flows: ``settings`` (what the adapter is told) →
``adapter`` (what it does to the cluster) → ``watching`` (what it sees) → ``events`` (what that
means for a job) → the operator's handlers (what users read in status). A module never imports
one further along that chain.
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
