"""The full stack on loopback: the control plane plus the real controllers it runs jobs with.

On top of the etcd + kube-apiserver + kube-controller-manager of `tests.cluster` this package
builds and runs kube-scheduler, KWOK (the kubelet of a handful of simulated GPU nodes), and the
real Kubeflow Trainer, JobSet and Kueue controllers, each a local process whose webhooks are
served on 127.0.0.1 with the stack's own CA. Every binary comes from the Go module proxy:
one wrapper module per upstream project (`trainer/`, `jobset/`, `kueue/`, `kwok/`), because each
pins its own Kubernetes libraries, and kube-scheduler from the control plane's own module.
"""
