"""The kopf operator: handlers for KubeflowAdapter and DispatchJob, and kopf's settings.

Importing this package registers every handler with kopf's default registry, so both
``kopf run -m dispatch_kubeflow.handlers`` and ``dispatch-kubeflow run`` serve the same operator.
"""

from dispatch_kubeflow.handlers import adapters, jobs, recovery, startup

__all__ = ["adapters", "jobs", "recovery", "startup"]
