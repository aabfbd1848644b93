"""The foundation: talking to the Kubernetes API.

Nothing here knows about jobs, settings or events. ``apierrors`` turns API and transport
failures into the project's error family; ``objects`` reads raw objects; ``workloads`` holds the
predicates on Kueue Workloads; ``informer`` is the one LIST+WATCH; ``leases`` the one Lease
model; ``connection`` makes API clients the way client-go would; ``lazyclient`` lets the
programs import kubernetes_asyncio's generated client name by name, as they use it.
"""
