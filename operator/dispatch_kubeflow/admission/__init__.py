"""dispatch-admission: the Kueue admission-check controller that holds the readmission gate.

Kueue evicts a Workload (preemption, node failure, pods-ready timeout) and, left alone, admits it
again as soon as quota allows. Dispatch wants to decide that itself: an evicted job may be retried,
moved, or given up. Kueue's two-phase admission gives it the hook. A ClusterQueue that lists our
AdmissionCheck admits nothing until this controller marks the check ``Ready`` on the Workload.

One controller decides one AdmissionCheck in every namespace. ``decisions`` holds the rules, as
pure functions of a Workload and its TrainJob; ``serving`` which namespaces are dispatch's, read
from the KubeflowAdapters of the check; ``controller`` runs one replica (informers, leader election
on ``kube.leaderelection``, the writes); ``health`` its liveness and readiness endpoint; ``logs``
its JSON log lines. The command line (``dispatch-kubeflow admission``, or
``python -m dispatch_kubeflow.admission``) is in ``dispatch_kubeflow.cli``.
"""
