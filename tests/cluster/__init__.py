"""A real etcd + kube-apiserver control plane for the test suite, built from Go modules."""
